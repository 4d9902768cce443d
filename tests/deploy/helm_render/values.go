package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// loadYAMLFile reads a values file the way Helm does: a YAML mapping (an empty file is an empty
// mapping), read into JSON's types, so that every number is a float64 (Helm reads values files
// through sigs.k8s.io/yaml, which goes through JSON).
func loadYAMLFile(path string) (map[string]interface{}, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return parseYAMLMap(data, path)
}

func parseYAMLMap(data []byte, what string) (map[string]interface{}, error) {
	var raw interface{}
	if err := yaml.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("%s: %v", what, err)
	}
	if raw == nil {
		return map[string]interface{}{}, nil
	}
	v, err := jsonTypes(raw, what)
	if err != nil {
		return nil, err
	}
	m, ok := v.(map[string]interface{})
	if !ok {
		return nil, fmt.Errorf("%s: the document is not a mapping", what)
	}
	return m, nil
}

// jsonTypes converts what yaml.v3 decoded into JSON's types: string-keyed maps, []interface{},
// float64 numbers, bools, strings and nil.
func jsonTypes(v interface{}, where string) (interface{}, error) {
	switch t := v.(type) {
	case map[string]interface{}:
		out := make(map[string]interface{}, len(t))
		for k, e := range t {
			c, err := jsonTypes(e, where)
			if err != nil {
				return nil, err
			}
			out[k] = c
		}
		return out, nil
	case map[interface{}]interface{}:
		out := make(map[string]interface{}, len(t))
		for k, e := range t {
			ks, ok := k.(string)
			if !ok {
				return nil, fmt.Errorf("%s: a mapping key is not a string: %v", where, k)
			}
			c, err := jsonTypes(e, where)
			if err != nil {
				return nil, err
			}
			out[ks] = c
		}
		return out, nil
	case []interface{}:
		out := make([]interface{}, len(t))
		for i, e := range t {
			c, err := jsonTypes(e, where)
			if err != nil {
				return nil, err
			}
			out[i] = c
		}
		return out, nil
	case int:
		return float64(t), nil
	case int64:
		return float64(t), nil
	case uint64:
		return float64(t), nil
	case float64, bool, string, nil:
		return t, nil
	default:
		return nil, fmt.Errorf("%s: a value of type %T has no JSON form", where, v)
	}
}

// mergeValues deep-merges src over dst as Helm coalesces a values file over the chart's: maps
// merge key by key, any other value replaces, and a null removes the key.
func mergeValues(dst, src map[string]interface{}) map[string]interface{} {
	out := make(map[string]interface{}, len(dst))
	for k, v := range dst {
		out[k] = v
	}
	for k, v := range src {
		if v == nil {
			delete(out, k)
			continue
		}
		sm, sok := v.(map[string]interface{})
		dm, dok := out[k].(map[string]interface{})
		if sok && dok {
			out[k] = mergeValues(dm, sm)
		} else {
			out[k] = v
		}
	}
	return out
}

// applySet applies one --set argument: comma-separated key=value pairs, a key being a dotted
// path (\. and \, escape), a value typed as Helm's --set types it (int64, true/false, null, else
// a string) or a list {a,b}. List indexes (key[0]=v) are not supported and refused.
func applySet(values map[string]interface{}, arg string) error {
	for _, pair := range splitUnescaped(arg, ',', true) {
		eq := strings.IndexByte(pair, '=')
		if eq <= 0 {
			return fmt.Errorf("--set %q: expected key=value", pair)
		}
		key, raw := pair[:eq], pair[eq+1:]
		if strings.ContainsAny(key, "[]") {
			return fmt.Errorf("--set %q: list indexes are not supported by this renderer", pair)
		}
		path := splitUnescaped(key, '.', false)
		var val interface{}
		if strings.HasPrefix(raw, "{") && strings.HasSuffix(raw, "}") {
			var list []interface{}
			inner := raw[1 : len(raw)-1]
			if inner != "" {
				for _, e := range strings.Split(inner, ",") {
					list = append(list, typedSetValue(e))
				}
			}
			val = list
		} else {
			val = typedSetValue(unescape(raw))
		}
		m := values
		for i, p := range path {
			if i == len(path)-1 {
				if val == nil {
					delete(m, p)
				} else {
					m[p] = val
				}
				break
			}
			next, ok := m[p].(map[string]interface{})
			if !ok {
				next = map[string]interface{}{}
				m[p] = next
			}
			m = next
		}
	}
	return nil
}

func typedSetValue(s string) interface{} {
	switch s {
	case "true":
		return true
	case "false":
		return false
	case "null":
		return nil
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil && (s == "0" || !strings.HasPrefix(s, "0")) {
		return n
	}
	return s
}

// splitUnescaped splits s at sep not preceded by a backslash; for top-level pairs it does not
// split inside {...} lists.
func splitUnescaped(s string, sep byte, braces bool) []string {
	var parts []string
	var cur strings.Builder
	depth := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\\' && i+1 < len(s):
			if braces {
				cur.WriteByte(c)
			}
			cur.WriteByte(s[i+1])
			i++
		case braces && c == '{':
			depth++
			cur.WriteByte(c)
		case braces && c == '}':
			depth--
			cur.WriteByte(c)
		case c == sep && depth == 0:
			parts = append(parts, cur.String())
			cur.Reset()
		default:
			cur.WriteByte(c)
		}
	}
	return append(parts, cur.String())
}

func unescape(s string) string {
	return strings.NewReplacer(`\,`, ",", `\.`, ".", `\\`, `\`).Replace(s)
}
