package config

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
)

// TOML writes c as a configuration file in the form defaults.toml uses
// (kernel_params as one space-separated string, as in Kata). Parsing the
// result gives c back.
func (c *Config) TOML() string {
	var b strings.Builder
	for i, s := range sections {
		if s.aliasOf != nil {
			continue
		}
		if i > 0 {
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "[%s]\n", dotted(s.path))
		v := reflect.ValueOf(s.field(c)).Elem()
		t := v.Type()
		for j := range t.NumField() {
			name, opts, _ := strings.Cut(t.Field(j).Tag.Get("toml"), ",")
			if name == "" || name == "-" {
				continue
			}
			fmt.Fprintf(&b, "%s = %s\n", name, tomlValue(v.Field(j), opts == "fields"))
		}
	}
	return b.String()
}

func tomlValue(f reflect.Value, fields bool) string {
	switch f.Kind() {
	case reflect.String:
		return strconv.Quote(f.String())
	case reflect.Int:
		return strconv.FormatInt(f.Int(), 10)
	case reflect.Bool:
		return strconv.FormatBool(f.Bool())
	case reflect.Slice:
		list := f.Interface().([]string)
		if fields {
			return strconv.Quote(strings.Join(list, " "))
		}
		q := make([]string, len(list))
		for i, s := range list {
			q[i] = strconv.Quote(s)
		}
		return "[" + strings.Join(q, ", ") + "]"
	}
	panic(fmt.Sprintf("config: unsupported field kind %s", f.Kind()))
}
