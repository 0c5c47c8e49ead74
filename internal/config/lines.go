package config

import (
	"strconv"
	"strings"
)

// keyLines maps each table header and key of a TOML document to the line
// (from 1) where it is written, keyed by its dotted full name. The TOML
// library keeps key positions to itself, so this follows just enough of
// the syntax to skip string contents and values that span lines.
func keyLines(data []byte) map[string]int {
	lines := map[string]int{}
	record := func(key []string, n int) {
		k := dotted(key)
		if _, ok := lines[k]; !ok {
			lines[k] = n
		}
	}
	var table []string
	var st valueState
	for i, line := range strings.Split(string(data), "\n") {
		n := i + 1
		if st.open() {
			st.scan(line)
			continue
		}
		t := strings.TrimSpace(line)
		switch {
		case t == "" || t[0] == '#':
		case t[0] == '[':
			inner := strings.TrimLeft(t, "[")
			if end := closingBracket(inner); end >= 0 {
				table = splitKey(inner[:end])
				record(table, n)
			}
		default:
			k, v, ok := cutAssign(t)
			if !ok {
				continue
			}
			full := append(append([]string(nil), table...), splitKey(k)...)
			record(full, n)
			st.scan(v)
		}
	}
	return lines
}

// valueState follows a value across lines: open brackets and an unclosed
// multi-line string.
type valueState struct {
	depth int
	multi string // `"""` or `'''` while inside a multi-line string
}

func (s *valueState) open() bool { return s.depth > 0 || s.multi != "" }

func (s *valueState) scan(v string) {
	for i := 0; i < len(v); i++ {
		if s.multi != "" {
			j := strings.Index(v[i:], s.multi)
			if j < 0 {
				return
			}
			i += j + len(s.multi) - 1
			s.multi = ""
			continue
		}
		switch c := v[i]; c {
		case '#':
			return
		case '[', '{':
			s.depth++
		case ']', '}':
			if s.depth > 0 {
				s.depth--
			}
		case '"', '\'':
			if strings.HasPrefix(v[i:], strings.Repeat(string(c), 3)) {
				s.multi = strings.Repeat(string(c), 3)
				i += 2
				continue
			}
			i = skipString(v, i)
		}
	}
}

// skipString returns the index of the quote that closes the string
// starting at v[i] (or the last index when it is not closed).
func skipString(v string, i int) int {
	q := v[i]
	for j := i + 1; j < len(v); j++ {
		if q == '"' && v[j] == '\\' {
			j++
			continue
		}
		if v[j] == q {
			return j
		}
	}
	return len(v) - 1
}

// cutAssign splits `key = value` at the first '=' outside quotes.
func cutAssign(t string) (key, value string, ok bool) {
	for i := 0; i < len(t); i++ {
		switch t[i] {
		case '"', '\'':
			i = skipString(t, i)
		case '=':
			return t[:i], t[i+1:], true
		}
	}
	return "", "", false
}

// closingBracket finds the ']' that ends a table header's key.
func closingBracket(s string) int {
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '"', '\'':
			i = skipString(s, i)
		case ']':
			return i
		}
	}
	return -1
}

// splitKey splits a dotted key into its parts, unquoting quoted parts.
func splitKey(k string) []string {
	var parts []string
	start := 0
	for i := 0; i <= len(k); i++ {
		if i < len(k) && (k[i] == '"' || k[i] == '\'') {
			i = skipString(k, i)
			continue
		}
		if i == len(k) || k[i] == '.' {
			parts = append(parts, unquoteKey(strings.TrimSpace(k[start:i])))
			start = i + 1
		}
	}
	return parts
}

func unquoteKey(p string) string {
	if len(p) >= 2 && p[0] == '"' && p[len(p)-1] == '"' {
		if u, err := strconv.Unquote(p); err == nil {
			return u
		}
	}
	if len(p) >= 2 && p[0] == '\'' && p[len(p)-1] == '\'' {
		return p[1 : len(p)-1]
	}
	return p
}
