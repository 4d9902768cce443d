package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"regexp"
	"sort"
	"strings"
)

// schemaKeywords are the JSON Schema (draft-07) keywords this checker implements; a schema
// using any other keyword is refused, so that nothing in values.schema.json goes unchecked.
var schemaKeywords = map[string]bool{
	"$schema": true, "$id": true, "title": true, "description": true, "default": true,
	"examples": true, "definitions": true, "$ref": true, "type": true, "properties": true,
	"additionalProperties": true, "required": true, "enum": true, "minimum": true,
	"maximum": true, "exclusiveMinimum": true, "exclusiveMaximum": true, "minLength": true,
	"maxLength": true, "pattern": true, "items": true, "minItems": true, "maxItems": true,
	"propertyNames": true, "not": true,
}

type schemaChecker struct {
	root   map[string]interface{}
	errors []string
}

func loadSchema(path string) (map[string]interface{}, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var s map[string]interface{}
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	return s, nil
}

// checkValues validates values against the schema as Helm does before rendering, returning one
// line per violation, each naming the value's path (e.g. "prismd.replica").
func checkValues(schema map[string]interface{}, values map[string]interface{}) ([]string, error) {
	c := &schemaChecker{root: schema}
	if err := c.check(schema, values, ""); err != nil {
		return nil, err
	}
	sort.Strings(c.errors)
	return c.errors, nil
}

func pathJoin(base, key string) string {
	if base == "" {
		return key
	}
	return base + "." + key
}

func (c *schemaChecker) fail(path, format string, args ...interface{}) {
	where := path
	if where == "" {
		where = "(root)"
	}
	c.errors = append(c.errors, fmt.Sprintf("%s: %s", where, fmt.Sprintf(format, args...)))
}

func jsonType(v interface{}) string {
	switch t := v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case string:
		return "string"
	case float64:
		if t == math.Trunc(t) {
			return "integer"
		}
		return "number"
	case int64:
		return "integer"
	case []interface{}:
		return "array"
	case map[string]interface{}:
		return "object"
	}
	return fmt.Sprintf("%T", v)
}

func asFloat(v interface{}) (float64, bool) {
	switch t := v.(type) {
	case float64:
		return t, true
	case int64:
		return float64(t), true
	}
	return 0, false
}

// check validates v at path against schema s; an error is a broken schema, not a bad value.
func (c *schemaChecker) check(s map[string]interface{}, v interface{}, path string) error {
	for k := range s {
		if !schemaKeywords[k] {
			return fmt.Errorf("values.schema.json: keyword %q (at %q) is not supported by this renderer", k, path)
		}
	}
	if ref, ok := s["$ref"].(string); ok {
		target, err := c.resolve(ref)
		if err != nil {
			return err
		}
		return c.check(target, v, path)
	}
	if t, ok := s["type"]; ok {
		var allowed []string
		switch tt := t.(type) {
		case string:
			allowed = []string{tt}
		case []interface{}:
			for _, e := range tt {
				allowed = append(allowed, fmt.Sprint(e))
			}
		}
		got := jsonType(v)
		match := false
		for _, a := range allowed {
			if a == got || (a == "number" && got == "integer") {
				match = true
			}
		}
		if !match {
			c.fail(path, "invalid type: expected %s, given %s", strings.Join(allowed, " or "), got)
			return nil
		}
	}
	if enum, ok := s["enum"].([]interface{}); ok {
		found := false
		for _, e := range enum {
			if fmt.Sprint(e) == fmt.Sprint(v) && jsonType(e) == jsonType(v) {
				found = true
			}
		}
		if !found {
			var names []string
			for _, e := range enum {
				names = append(names, fmt.Sprintf("%v", e))
			}
			c.fail(path, "must be one of %s, given %v", strings.Join(names, ", "), v)
		}
	}
	if n, ok := asFloat(v); ok {
		if m, ok := s["minimum"].(float64); ok && n < m {
			c.fail(path, "must be at least %v, given %v", m, n)
		}
		if m, ok := s["maximum"].(float64); ok && n > m {
			c.fail(path, "must be at most %v, given %v", m, n)
		}
		if m, ok := s["exclusiveMinimum"].(float64); ok && n <= m {
			c.fail(path, "must be greater than %v, given %v", m, n)
		}
		if m, ok := s["exclusiveMaximum"].(float64); ok && n >= m {
			c.fail(path, "must be less than %v, given %v", m, n)
		}
	}
	if not, ok := s["not"].(map[string]interface{}); ok {
		// Valid against "not" is the violation; the sub-schema's description says why.
		sub := &schemaChecker{root: c.root}
		if err := sub.check(not, v, path); err != nil {
			return err
		}
		if len(sub.errors) == 0 {
			why, _ := not["description"].(string)
			if why == "" {
				why = "it matches the schema of \"not\""
			}
			c.fail(path, "is refused (%s), given %s", why, quoteValue(v))
		}
	}
	if str, ok := v.(string); ok {
		runes := float64(len([]rune(str)))
		if m, ok := s["minLength"].(float64); ok && runes < m {
			c.fail(path, "must be at least %v characters long", m)
		}
		if m, ok := s["maxLength"].(float64); ok && runes > m {
			c.fail(path, "must be at most %v characters long", m)
		}
		if p, ok := s["pattern"].(string); ok {
			re, err := regexp.Compile(p)
			if err != nil {
				return fmt.Errorf("values.schema.json: pattern %q: %v", p, err)
			}
			if !re.MatchString(str) {
				c.fail(path, "does not match pattern %q, given %q", p, str)
			}
		}
	}
	if list, ok := v.([]interface{}); ok {
		if m, ok := s["minItems"].(float64); ok && float64(len(list)) < m {
			c.fail(path, "must have at least %v items", m)
		}
		if m, ok := s["maxItems"].(float64); ok && float64(len(list)) > m {
			c.fail(path, "must have at most %v items", m)
		}
		if items, ok := s["items"].(map[string]interface{}); ok {
			for i, e := range list {
				if err := c.check(items, e, fmt.Sprintf("%s[%d]", path, i)); err != nil {
					return err
				}
			}
		}
	}
	if obj, ok := v.(map[string]interface{}); ok {
		if req, ok := s["required"].([]interface{}); ok {
			for _, r := range req {
				if _, ok := obj[fmt.Sprint(r)]; !ok {
					c.fail(path, "missing property %q", r)
				}
			}
		}
		if names, ok := s["propertyNames"].(map[string]interface{}); ok {
			// Each key checked as a string; a violation names the key's path.
			keys := make([]string, 0, len(obj))
			for k := range obj {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				sub := &schemaChecker{root: c.root}
				if err := sub.check(names, k, ""); err != nil {
					return err
				}
				for _, e := range sub.errors {
					c.fail(pathJoin(path, k), "property name %s", strings.TrimPrefix(e, "(root): "))
				}
			}
		}
		props, _ := s["properties"].(map[string]interface{})
		keys := make([]string, 0, len(obj))
		for k := range obj {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if ps, ok := props[k].(map[string]interface{}); ok {
				if err := c.check(ps, obj[k], pathJoin(path, k)); err != nil {
					return err
				}
				continue
			}
			switch ap := s["additionalProperties"].(type) {
			case bool:
				if !ap {
					c.fail(pathJoin(path, k), "additional property %q is not allowed", k)
				}
			case map[string]interface{}:
				if err := c.check(ap, obj[k], pathJoin(path, k)); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// quoteValue writes a string quoted and anything else as fmt's %v.
func quoteValue(v interface{}) string {
	if str, ok := v.(string); ok {
		return fmt.Sprintf("%q", str)
	}
	return fmt.Sprintf("%v", v)
}

// resolve follows a local reference "#/definitions/NAME" (the only kind supported).
func (c *schemaChecker) resolve(ref string) (map[string]interface{}, error) {
	const prefix = "#/definitions/"
	if !strings.HasPrefix(ref, prefix) {
		return nil, fmt.Errorf("values.schema.json: $ref %q: only #/definitions/NAME is supported", ref)
	}
	defs, _ := c.root["definitions"].(map[string]interface{})
	target, ok := defs[strings.TrimPrefix(ref, prefix)].(map[string]interface{})
	if !ok {
		return nil, fmt.Errorf("values.schema.json: $ref %q names no definition", ref)
	}
	return target, nil
}
