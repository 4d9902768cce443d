package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"text/template"

	"github.com/Masterminds/sprig"
	"gopkg.in/yaml.v3"
)

// chartMeta is Chart.yaml as templates see it in .Chart (the fields the chart may use).
type chartMeta struct {
	APIVersion  string   `yaml:"apiVersion"`
	Name        string   `yaml:"name"`
	Version     string   `yaml:"version"`
	AppVersion  string   `yaml:"appVersion"`
	Description string   `yaml:"description"`
	Type        string   `yaml:"type"`
	KubeVersion string   `yaml:"kubeVersion"`
	Keywords    []string `yaml:"keywords"`
}

// chartFiles is .Files: every file of the chart outside templates/, by its slash-separated path
// relative to the chart's directory.
type chartFiles map[string][]byte

// Get returns a file's content, "" when there is none (as Helm's .Files.Get).
func (f chartFiles) Get(name string) string { return string(f[name]) }

// Glob returns the files whose path matches pattern (path.Match: * does not cross a slash).
func (f chartFiles) Glob(pattern string) chartFiles {
	out := chartFiles{}
	for name, data := range f {
		if ok, _ := path.Match(pattern, name); ok {
			out[name] = data
		}
	}
	return out
}

type kubeVersion struct{ Version, Major, Minor string }
type capabilities struct{ KubeVersion kubeVersion }
type releaseInfo struct {
	Name, Namespace, Service string
	IsInstall, IsUpgrade     bool
	Revision                 int
}
type templateInfo struct{ Name, BasePath string }

// toYAML is Helm's toYaml: the value marshalled to JSON, that JSON read as YAML and written as
// YAML (as sigs.k8s.io/yaml does: keys sorted, numbers as JSON wrote them), less its final newline.
func toYAML(v interface{}) (string, error) {
	j, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	var generic interface{}
	if err := yaml.Unmarshal(j, &generic); err != nil {
		return "", err
	}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(generic); err != nil {
		return "", err
	}
	enc.Close()
	return strings.TrimSuffix(buf.String(), "\n"), nil
}

// engine holds the parsed templates of one chart and renders them as Helm does.
type engine struct {
	tmpl  *template.Template
	chart string
}

// funcMap is Sprig's text functions without env and expandenv (Helm removes them), with Helm's
// own: include, tpl, required, toYaml, fromYaml, toJson, fromJson, lookup.
func (e *engine) funcMap() template.FuncMap {
	f := sprig.TxtFuncMap()
	delete(f, "env")
	delete(f, "expandenv")
	f["include"] = func(name string, data interface{}) (string, error) {
		var buf bytes.Buffer
		if err := e.tmpl.ExecuteTemplate(&buf, name, data); err != nil {
			return "", err
		}
		return buf.String(), nil
	}
	f["tpl"] = func(text string, data interface{}) (string, error) {
		clone, err := e.tmpl.Clone()
		if err != nil {
			return "", err
		}
		t, err := clone.New(e.chart + "/templates/_tpl").Parse(text)
		if err != nil {
			return "", fmt.Errorf("tpl: %v", err)
		}
		var buf bytes.Buffer
		if err := t.Execute(&buf, data); err != nil {
			return "", fmt.Errorf("tpl: %v", err)
		}
		return strings.ReplaceAll(buf.String(), "<no value>", ""), nil
	}
	f["required"] = func(msg string, v interface{}) (interface{}, error) {
		if v == nil {
			return nil, fmt.Errorf("%s", msg)
		}
		if s, ok := v.(string); ok && s == "" {
			return nil, fmt.Errorf("%s", msg)
		}
		return v, nil
	}
	f["toYaml"] = func(v interface{}) string {
		s, err := toYAML(v)
		if err != nil {
			return ""
		}
		return s
	}
	f["fromYaml"] = func(s string) map[string]interface{} {
		m, err := parseYAMLMap([]byte(s), "fromYaml")
		if err != nil {
			return map[string]interface{}{"Error": err.Error()}
		}
		return m
	}
	f["toJson"] = func(v interface{}) string {
		j, err := json.Marshal(v)
		if err != nil {
			return ""
		}
		return string(j)
	}
	f["fromJson"] = func(s string) map[string]interface{} {
		m := map[string]interface{}{}
		if err := json.Unmarshal([]byte(s), &m); err != nil {
			m["Error"] = err.Error()
		}
		return m
	}
	// No cluster: lookup finds nothing, as under `helm template`.
	f["lookup"] = func(apiVersion, kind, namespace, name string) (map[string]interface{}, error) {
		return map[string]interface{}{}, nil
	}
	return f
}

// loadTemplates parses every file under the chart's templates/ as one template set, each named
// CHART/templates/RELPATH, and returns the names in lexical order.
func (e *engine) loadTemplates(chartDir string) ([]string, error) {
	e.tmpl = template.New(e.chart).Option("missingkey=zero")
	funcs := e.funcMap()
	e.tmpl.Funcs(funcs)
	var names []string
	root := filepath.Join(chartDir, "templates")
	err := filepath.Walk(root, func(p string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		name := e.chart + "/templates/" + filepath.ToSlash(rel)
		if _, err := e.tmpl.New(name).Funcs(funcs).Parse(string(data)); err != nil {
			return err
		}
		names = append(names, name)
		return nil
	})
	sort.Strings(names)
	return names, err
}

// render executes one template with the top-level object, as Helm does (<no value> blanked).
func (e *engine) render(name string, top map[string]interface{}) (string, error) {
	var buf bytes.Buffer
	scoped := make(map[string]interface{}, len(top)+1)
	for k, v := range top {
		scoped[k] = v
	}
	scoped["Template"] = templateInfo{Name: name, BasePath: e.chart + "/templates"}
	if err := e.tmpl.ExecuteTemplate(&buf, name, scoped); err != nil {
		return "", err
	}
	return strings.ReplaceAll(buf.String(), "<no value>", ""), nil
}

// installOrder is Helm's kind order for its output (kinds not listed come after, by kind name).
var installOrder = []string{
	"PriorityClass", "Namespace", "NetworkPolicy", "ResourceQuota", "LimitRange",
	"PodSecurityPolicy", "PodDisruptionBudget", "ServiceAccount", "Secret", "SecretList",
	"ConfigMap", "StorageClass", "PersistentVolume", "PersistentVolumeClaim",
	"CustomResourceDefinition", "ClusterRole", "ClusterRoleList", "ClusterRoleBinding",
	"ClusterRoleBindingList", "Role", "RoleList", "RoleBinding", "RoleBindingList", "Service",
	"DaemonSet", "Pod", "ReplicationController", "ReplicaSet", "Deployment",
	"HorizontalPodAutoscaler", "StatefulSet", "Job", "CronJob", "IngressClass", "Ingress",
	"APIService",
}

type manifest struct {
	source, content, kind string
}

var docSeparator = regexp.MustCompile(`(?m)(?:^|\s*\n)---\s*(?:\n|$)`)

// splitManifests cuts one template's output into its YAML documents, drops the empty ones, and
// checks that each parses as YAML and names its kind.
func splitManifests(source, out string) ([]manifest, error) {
	var list []manifest
	for _, doc := range docSeparator.Split(out, -1) {
		doc = strings.TrimSpace(doc)
		if doc == "" {
			continue
		}
		var head struct {
			APIVersion string `yaml:"apiVersion"`
			Kind       string `yaml:"kind"`
		}
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			return nil, fmt.Errorf("YAML parse error on %s: %v", source, err)
		}
		if head.Kind == "" || head.APIVersion == "" {
			return nil, fmt.Errorf("%s: a document without apiVersion or kind", source)
		}
		list = append(list, manifest{source: source, content: doc, kind: head.Kind})
	}
	return list, nil
}

func kindRank(kind string) int {
	for i, k := range installOrder {
		if k == kind {
			return i
		}
	}
	return len(installOrder)
}

// sortManifests orders documents as Helm's output does: by installOrder, unknown kinds last by
// kind name, documents of one kind in template name order.
func sortManifests(list []manifest) {
	sort.SliceStable(list, func(i, j int) bool {
		ri, rj := kindRank(list[i].kind), kindRank(list[j].kind)
		if ri != rj {
			return ri < rj
		}
		if ri == len(installOrder) {
			return list[i].kind < list[j].kind
		}
		return false
	})
}
