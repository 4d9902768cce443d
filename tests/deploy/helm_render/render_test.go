package main

import (
	"reflect"
	"strings"
	"testing"
)

// Helm's merge: maps merge key by key, other values replace, null removes the key.
func TestMergeValuesLikeHelm(t *testing.T) {
	base := map[string]interface{}{
		"a": map[string]interface{}{"x": 1.0, "y": []interface{}{"k"}, "z": "keep"},
		"b": "drop",
		"c": map[string]interface{}{"m": 1.0},
	}
	over := map[string]interface{}{
		"a": map[string]interface{}{"x": 2.0, "y": []interface{}{}},
		"b": nil,
		"c": "scalar replaces a map",
	}
	got := mergeValues(base, over)
	want := map[string]interface{}{
		"a": map[string]interface{}{"x": 2.0, "y": []interface{}{}, "z": "keep"},
		"c": "scalar replaces a map",
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %#v, want %#v", got, want)
	}
	if base["b"] != "drop" {
		t.Fatalf("the chart's values were changed in place")
	}
}

// Values files are read through JSON's types, as Helm reads them: numbers are float64.
func TestValuesFileNumbersAreFloat64(t *testing.T) {
	m, err := parseYAMLMap([]byte("n: 1000000\nf: 0.5\ns: \"1\"\nl: [1, two]\n"), "test")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]interface{}{"n": 1e6, "f": 0.5, "s": "1", "l": []interface{}{1.0, "two"}}
	if !reflect.DeepEqual(m, want) {
		t.Fatalf("got %#v, want %#v", m, want)
	}
}

// --set types values as Helm does and understands dotted keys, escapes and lists.
func TestApplySet(t *testing.T) {
	v := map[string]interface{}{"a": map[string]interface{}{"keep": true, "gone": "x"}}
	for _, arg := range []string{`a.n=5,a.b=true,a.s=05,a.gone=null`, `a.l={x,2}`, `k\.dotted=a\,b`} {
		if err := applySet(v, arg); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]interface{}{
		"a":        map[string]interface{}{"keep": true, "n": int64(5), "b": true, "s": "05", "l": []interface{}{"x", int64(2)}},
		"k.dotted": "a,b",
	}
	if !reflect.DeepEqual(v, want) {
		t.Fatalf("got %#v, want %#v", v, want)
	}
	if err := applySet(v, "a[0]=1"); err == nil || !strings.Contains(err.Error(), "list indexes are not supported") {
		t.Fatalf("a list index was not refused: %v", err)
	}
}

// The schema subset: each keyword's violation is reported with the value's path; an unknown
// keyword is an error of the schema.
func TestSchemaKeywords(t *testing.T) {
	schema := map[string]interface{}{
		"definitions": map[string]interface{}{"port": map[string]interface{}{"type": "integer", "minimum": 1.0, "maximum": 65535.0}},
		"type":        "object", "additionalProperties": false, "required": []interface{}{"need"},
		"properties": map[string]interface{}{
			"need":  map[string]interface{}{"type": "string"},
			"port":  map[string]interface{}{"$ref": "#/definitions/port"},
			"mode":  map[string]interface{}{"enum": []interface{}{"a", "b"}},
			"name":  map[string]interface{}{"type": "string", "pattern": "^[a-z]+$", "maxLength": 3.0},
			"list":  map[string]interface{}{"type": "array", "minItems": 1.0, "items": map[string]interface{}{"type": "boolean"}},
			"ratio": map[string]interface{}{"type": "number", "exclusiveMinimum": 0.0},
			"map":   map[string]interface{}{"type": "object", "additionalProperties": map[string]interface{}{"type": "string"}},
			"ids": map[string]interface{}{"type": "object",
				"propertyNames": map[string]interface{}{"pattern": "^[a-z]+$", "maxLength": 4.0}},
			"args": map[string]interface{}{"type": "array", "items": map[string]interface{}{"type": "string",
				"not": map[string]interface{}{"pattern": "^--dir(=|$)", "description": "the chart sets --dir"}}},
		},
	}
	values := map[string]interface{}{
		"port": 70000.0, "mode": "c", "name": "Abcd", "list": []interface{}{true, "no"},
		"ratio": 0.0, "map": map[string]interface{}{"k": 1.0}, "extra": 1.0,
		"ids":  map[string]interface{}{"ok": "x", "a:b": "y", "abcde": "z"},
		"args": []interface{}{"--dir=/x", "--directory=/y", "--dir"},
	}
	got, err := checkValues(schema, values)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		`(root): missing property "need"`,
		`args[0]: is refused (the chart sets --dir), given "--dir=/x"`,
		`args[2]: is refused (the chart sets --dir), given "--dir"`,
		`extra: additional property "extra" is not allowed`,
		`ids.a:b: property name does not match pattern "^[a-z]+$", given "a:b"`,
		`ids.abcde: property name must be at most 4 characters long`,
		`list[1]: invalid type: expected boolean, given string`,
		`map.k: invalid type: expected string, given integer`,
		`mode: must be one of a, b, given c`,
		`name: does not match pattern "^[a-z]+$", given "Abcd"`,
		`name: must be at most 3 characters long`,
		`port: must be at most 65535, given 70000`,
		`ratio: must be greater than 0, given 0`,
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if _, err := checkValues(map[string]interface{}{"oneOf": []interface{}{}}, values); err == nil {
		t.Fatal("an unsupported keyword was accepted")
	}
}

// Output: documents split, empty ones dropped, ordered by Helm's kind order, unknown kinds last.
func TestManifestsSplitAndOrdered(t *testing.T) {
	var all []manifest
	for _, tc := range []struct{ source, out string }{
		{"c/templates/a.yaml", "\n---\napiVersion: apps/v1\nkind: StatefulSet\n---\n# only a comment line and\napiVersion: v1\nkind: Service\n"},
		{"c/templates/b.yaml", "apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\n---\napiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\n"},
		{"c/templates/c.yaml", "   \n"},
		{"c/templates/d.yaml", "apiVersion: v1\nkind: Secret\n"},
	} {
		docs, err := splitManifests(tc.source, tc.out)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, docs...)
	}
	sortManifests(all)
	var kinds []string
	for _, m := range all {
		kinds = append(kinds, m.kind)
	}
	want := []string{"Secret", "Service", "StatefulSet", "PrometheusRule", "ServiceMonitor"}
	if !reflect.DeepEqual(kinds, want) {
		t.Fatalf("got %v, want %v", kinds, want)
	}
	if _, err := splitManifests("c/templates/e.yaml", "kind: [\n"); err == nil || !strings.Contains(err.Error(), "YAML parse error on c/templates/e.yaml") {
		t.Fatalf("a YAML error was not reported: %v", err)
	}
}

// toYaml goes through JSON as Helm's does: keys sorted, whole floats written as integers.
func TestToYAML(t *testing.T) {
	got, err := toYAML(map[string]interface{}{"b": 1e6, "a": []interface{}{"x", 0.5}, "c": map[string]interface{}{}})
	if err != nil {
		t.Fatal(err)
	}
	want := "a:\n  - x\n  - 0.5\nb: 1000000\nc: {}"
	if got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}
