package config

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

// Error is an invalid configuration: a TOML syntax error, a value of the
// wrong type or a value out of its allowed set. Several are joined with
// errors.Join.
type Error struct {
	File  string // the file's path, or "built-in defaults"
	Line  int    // 0 when unknown
	Key   string // dotted, e.g. "hypervisor.qemu.default_memory"; "" for syntax errors
	Value string // the value as written in TOML
	Msg   string // what is wrong, and what is allowed
	Err   error  // the underlying error, if any
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
	}
	b.WriteString(": ")
	if e.Key != "" {
		fmt.Fprintf(&b, "%s = %s: ", e.Key, e.Value)
	}
	b.WriteString(e.Msg)
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

// Warning is a key (or a whole section) that was ignored.
type Warning struct {
	File string `json:"file"`
	Line int    `json:"line,omitempty"`
	Key  string `json:"key"`
	Msg  string `json:"message"`
}

func (w Warning) String() string {
	if w.Line > 0 {
		return fmt.Sprintf("%s:%d: %s: %s", w.File, w.Line, w.Key, w.Msg)
	}
	return fmt.Sprintf("%s: %s: %s", w.File, w.Key, w.Msg)
}

// section maps a TOML table onto a part of Config.
type section struct {
	path  []string
	field func(*Config) any // pointer to the section's struct
	// alias: only the struct's keys are read from here, and a key set in
	// the primary section too is ignored with a warning.
	aliasOf []string
}

var sections = []section{
	{path: []string{"hypervisor", "qemu"}, field: func(c *Config) any { return &c.Hypervisor }},
	{path: []string{"agent"}, field: func(c *Config) any { return &c.Agent }},
	{path: []string{"runtime"}, field: func(c *Config) any { return &c.Runtime }},
	{path: []string{"factory"}, field: func(c *Config) any { return &c.Factory }},
	// Kata's agent keys: same meaning, so they apply to [agent].
	{path: []string{"agent", "kata"}, field: func(c *Config) any { return &c.Agent }, aliasOf: []string{"agent"}},
}

// fieldInfo is one key of a section struct.
type fieldInfo struct {
	index  int
	fields bool // a []string written as one space-separated string
}

func structKeys(t reflect.Type) map[string]fieldInfo {
	keys := map[string]fieldInfo{}
	for i := range t.NumField() {
		name, opts, _ := strings.Cut(t.Field(i).Tag.Get("toml"), ",")
		if name == "" || name == "-" {
			continue
		}
		keys[name] = fieldInfo{index: i, fields: opts == "fields"}
	}
	return keys
}

// decoded is what decodeInto learnt about a file besides the values.
type decoded struct {
	warnings []Warning
	lines    map[string]int // dotted key or table -> line
}

// decodeInto sets the fields of c that data sets, leaving the others
// as they are. Unknown keys become warnings; values of the wrong type are
// errors.
func decodeInto(c *Config, file string, data []byte) (*decoded, error) {
	d := &decoded{lines: keyLines(data)}
	var raw map[string]any
	md, err := toml.Decode(string(data), &raw)
	if err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			return d, &Error{File: file, Line: pe.Position.Line, Msg: "invalid TOML: " + pe.Message, Err: err}
		}
		return d, &Error{File: file, Msg: "invalid TOML", Err: err}
	}

	var errs []error
	reported := map[string]bool{} // unknown sections already warned about
	for _, key := range md.Keys() {
		if coveredBy(key, reported) {
			continue
		}
		v, ok := lookup(raw, key)
		if !ok {
			continue
		}
		if _, isTable := v.(map[string]any); isTable {
			if !knownTable(key) {
				d.unknownSection(file, key, v, reported)
			}
			continue
		}
		sec := sectionOf(key[:len(key)-1])
		if sec == nil {
			if p := unknownPrefix(key); p != nil {
				sv, _ := lookup(raw, p)
				d.unknownSection(file, p, sv, reported)
			} else {
				d.warn(file, key, "unknown key, ignored")
			}
			continue
		}
		if err := d.set(c, file, sec, key, v, md); err != nil {
			errs = append(errs, err)
		}
	}
	return d, errors.Join(errs...)
}

func (d *decoded) set(c *Config, file string, sec *section, key toml.Key, v any, md toml.MetaData) error {
	name := key[len(key)-1]
	target := reflect.ValueOf(sec.field(c)).Elem()
	keys := structKeys(target.Type())
	fi, ok := keys[name]
	if !ok {
		msg := "unknown key, ignored"
		if s := suggest(name, keys); s != "" {
			msg += fmt.Sprintf(" (did you mean %s?)", s)
		}
		d.warn(file, key, msg)
		return nil
	}
	if sec.aliasOf != nil {
		primary := append(slices.Clone(sec.aliasOf), name)
		if md.IsDefined(primary...) {
			d.warn(file, key, fmt.Sprintf("ignored: %s is set too and wins", dotted(primary)))
			return nil
		}
	}
	if msg := setValue(target.Field(fi.index), fi.fields, v); msg != "" {
		return &Error{File: file, Line: d.lines[dotted(key)], Key: dotted(key), Value: formatValue(v), Msg: msg}
	}
	return nil
}

// setValue stores the TOML value v in f, or says what type was expected.
func setValue(f reflect.Value, fields bool, v any) string {
	switch f.Kind() {
	case reflect.String:
		s, ok := v.(string)
		if !ok {
			return "must be a string"
		}
		f.SetString(s)
	case reflect.Int:
		n, ok := v.(int64)
		if !ok {
			return "must be an integer"
		}
		f.SetInt(n)
	case reflect.Bool:
		b, ok := v.(bool)
		if !ok {
			return "must be true or false"
		}
		f.SetBool(b)
	case reflect.Slice:
		if fields {
			s, ok := v.(string)
			if !ok {
				return `must be a string of space-separated parameters, e.g. "quiet console=hvc0"`
			}
			f.Set(reflect.ValueOf(strings.Fields(s)))
			return ""
		}
		list, ok := v.([]any)
		if !ok {
			return "must be a list of strings"
		}
		out := make([]string, 0, len(list))
		for _, e := range list {
			s, ok := e.(string)
			if !ok {
				return "must be a list of strings"
			}
			out = append(out, s)
		}
		f.Set(reflect.ValueOf(out))
	default:
		panic(fmt.Sprintf("config: unsupported field kind %s", f.Kind()))
	}
	return ""
}

func (d *decoded) warn(file string, key toml.Key, msg string) {
	k := dotted(key)
	d.warnings = append(d.warnings, Warning{File: file, Line: d.lines[k], Key: k, Msg: msg})
}

// unknownSection warns once about a table Hull does not read, naming its keys.
func (d *decoded) unknownSection(file string, key toml.Key, v any, reported map[string]bool) {
	reported[dotted(key)] = true
	msg := "section not used by Hull, ignored"
	if m, ok := v.(map[string]any); ok && len(m) > 0 {
		names := make([]string, 0, len(m))
		for k := range m {
			names = append(names, k)
		}
		sort.Strings(names)
		msg += " (keys: " + strings.Join(names, ", ") + ")"
	}
	line := d.lines[dotted(key)]
	if line == 0 {
		// A table made implicitly by a dotted key: point at its first key.
		for k, l := range d.lines {
			if strings.HasPrefix(k, dotted(key)+".") && (line == 0 || l < line) {
				line = l
			}
		}
	}
	d.warnings = append(d.warnings, Warning{File: file, Line: line, Key: "[" + dotted(key) + "]", Msg: msg})
}

func sectionOf(path []string) *section {
	for i := range sections {
		if slices.Equal(sections[i].path, path) {
			return &sections[i]
		}
	}
	return nil
}

// knownTable reports whether path is a section or leads to one.
func knownTable(path []string) bool {
	for _, s := range sections {
		if len(path) <= len(s.path) && slices.Equal(s.path[:len(path)], path) {
			return true
		}
	}
	return false
}

// unknownPrefix returns the shortest proper prefix of key that is a table
// Hull does not know, or nil.
func unknownPrefix(key toml.Key) toml.Key {
	for i := 1; i < len(key); i++ {
		if !knownTable(key[:i]) {
			return key[:i]
		}
	}
	return nil
}

func coveredBy(key toml.Key, reported map[string]bool) bool {
	for i := 1; i <= len(key); i++ {
		if reported[dotted(key[:i])] {
			return true
		}
	}
	return false
}

// lookup finds key in the decoded document. It fails for keys inside an
// array of tables.
func lookup(m map[string]any, key []string) (any, bool) {
	var v any = m
	for _, k := range key {
		t, ok := v.(map[string]any)
		if !ok {
			return nil, false
		}
		if v, ok = t[k]; !ok {
			return nil, false
		}
	}
	return v, true
}

func dotted(key []string) string { return strings.Join(key, ".") }

// formatValue writes v as it would appear in TOML.
func formatValue(v any) string {
	switch v := v.(type) {
	case string:
		return strconv.Quote(v)
	case []any:
		parts := make([]string, len(v))
		for i, e := range v {
			parts[i] = formatValue(e)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case []map[string]any:
		return "[array of tables]"
	case map[string]any:
		return "{table}"
	case time.Time:
		return v.Format(time.RFC3339Nano)
	default:
		return fmt.Sprint(v)
	}
}

// suggest returns the key of keys closest to name if it is a likely typo.
func suggest(name string, keys map[string]fieldInfo) string {
	best, bestDist := "", 3
	for k := range keys {
		if dist := editDistance(name, k); dist < bestDist || dist == bestDist && best != "" && k < best {
			best, bestDist = k, dist
		}
	}
	if bestDist > 2 {
		return ""
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
