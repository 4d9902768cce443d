// helm_render renders a Helm chart as `helm template` does, for the parts of Helm that
// helm/prism uses (helm/README.md lists them), so that the chart is rendered in CI where there
// is no helm binary: values.yaml deep-merged with --values files and --set, checked against
// values.schema.json, then every template executed by Go's text/template with Sprig's functions
// and Helm's own, the output written as a multi-document YAML stream, each document led by
// "# Source: CHART/templates/FILE". NOTES.txt goes to stderr, or to --notes FILE.
//
//	helm_render --chart helm/prism [--values FILE]... [--set k=v]... --release NAME --namespace NS
//
// Exit status 0, or 1 with a message on stderr for any values, schema or template error.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/Masterminds/semver"
	"gopkg.in/yaml.v3"
)

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(s string) error { *m = append(*m, s); return nil }

var releaseName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "Error: %v\n", err)
		os.Exit(1)
	}
}

// loadChart reads Chart.yaml and every file outside templates/ (the chart's .Files).
func loadChart(dir string) (*chartMeta, chartFiles, error) {
	data, err := os.ReadFile(filepath.Join(dir, "Chart.yaml"))
	if err != nil {
		return nil, nil, err
	}
	var meta chartMeta
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	dec.KnownFields(true)
	if err := dec.Decode(&meta); err != nil {
		return nil, nil, fmt.Errorf("Chart.yaml: %v", err)
	}
	if meta.APIVersion != "v2" || meta.Name == "" || meta.Version == "" {
		return nil, nil, fmt.Errorf("Chart.yaml: apiVersion v2, name and version are required")
	}
	if _, err := semver.StrictNewVersion(meta.Version); err != nil {
		return nil, nil, fmt.Errorf("Chart.yaml: version %q is not SemVer 2", meta.Version)
	}
	files := chartFiles{}
	err = filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		rel = filepath.ToSlash(rel)
		if info.IsDir() {
			if rel == "templates" {
				return filepath.SkipDir
			}
			return nil
		}
		content, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		files[rel] = content
		return nil
	})
	return &meta, files, err
}

func run() error {
	var valueFiles, sets multiFlag
	chartDir := flag.String("chart", "", "the chart's directory")
	release := flag.String("release", "", "release name")
	namespace := flag.String("namespace", "", "release namespace")
	notesPath := flag.String("notes", "", "write the rendered NOTES.txt here instead of stderr")
	kube := flag.String("kube-version", "1.32.0", "Kubernetes version of .Capabilities.KubeVersion, checked against Chart.yaml's kubeVersion")
	flag.Var(&valueFiles, "values", "a values file merged over the chart's values.yaml (repeatable, later wins)")
	flag.Var(&sets, "set", "key=value set over the values (repeatable)")
	flag.Parse()
	if flag.NArg() != 0 {
		return fmt.Errorf("unexpected arguments: %v", flag.Args())
	}
	if *chartDir == "" || *release == "" || *namespace == "" {
		return fmt.Errorf("--chart, --release and --namespace are required")
	}
	if len(*release) > 53 || !releaseName.MatchString(*release) {
		return fmt.Errorf("release name %q: a DNS-1123 subdomain of 53 characters at most is required", *release)
	}

	meta, files, err := loadChart(*chartDir)
	if err != nil {
		return err
	}
	kv, err := semver.NewVersion(*kube)
	if err != nil {
		return fmt.Errorf("--kube-version %q: %v", *kube, err)
	}
	if meta.KubeVersion != "" {
		c, err := semver.NewConstraint(meta.KubeVersion)
		if err != nil {
			return fmt.Errorf("Chart.yaml kubeVersion %q: %v", meta.KubeVersion, err)
		}
		if !c.Check(kv) {
			return fmt.Errorf("chart requires kubeVersion: %s which is incompatible with Kubernetes v%s", meta.KubeVersion, kv)
		}
	}

	values, err := loadYAMLFile(filepath.Join(*chartDir, "values.yaml"))
	if err != nil {
		return err
	}
	for _, f := range valueFiles {
		user, err := loadYAMLFile(f)
		if err != nil {
			return err
		}
		values = mergeValues(values, user)
	}
	for _, s := range sets {
		if err := applySet(values, s); err != nil {
			return err
		}
	}
	if _, err := os.Stat(filepath.Join(*chartDir, "values.schema.json")); err == nil {
		schema, err := loadSchema(filepath.Join(*chartDir, "values.schema.json"))
		if err != nil {
			return err
		}
		problems, err := checkValues(schema, values)
		if err != nil {
			return err
		}
		if len(problems) > 0 {
			return fmt.Errorf("values don't meet the specifications of the schema(s) in the following chart(s):\n%s:\n- %s",
				meta.Name, strings.Join(problems, "\n- "))
		}
	}

	e := &engine{chart: meta.Name}
	names, err := e.loadTemplates(*chartDir)
	if err != nil {
		return err
	}
	top := map[string]interface{}{
		"Values": values,
		"Chart":  meta,
		"Files":  files,
		"Release": releaseInfo{Name: *release, Namespace: *namespace, Service: "Helm",
			IsInstall: true, Revision: 1},
		"Capabilities": capabilities{KubeVersion: kubeVersion{
			Version: "v" + kv.String(), Major: fmt.Sprint(kv.Major()), Minor: fmt.Sprint(kv.Minor())}},
	}
	var manifests []manifest
	notes := ""
	for _, name := range names {
		base := filepath.Base(name)
		if strings.HasPrefix(base, "_") {
			continue
		}
		out, err := e.render(name, top)
		if err != nil {
			return err
		}
		if base == "NOTES.txt" {
			notes = out
			continue
		}
		docs, err := splitManifests(name, out)
		if err != nil {
			return err
		}
		manifests = append(manifests, docs...)
	}
	sortManifests(manifests)
	var sb strings.Builder
	for _, m := range manifests {
		fmt.Fprintf(&sb, "---\n# Source: %s\n%s\n", m.source, m.content)
	}
	if _, err := os.Stdout.WriteString(sb.String()); err != nil {
		return err
	}
	if *notesPath != "" {
		return os.WriteFile(*notesPath, []byte(notes), 0o644)
	}
	if notes != "" {
		fmt.Fprint(os.Stderr, notes)
	}
	return nil
}
