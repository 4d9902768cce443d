#!/usr/bin/python3
"""The dashboard lint (lint_dashboards.py) catches what it says it catches.

Each case copies deploy/grafana/*.json into a temporary directory, breaks one thing in one
dashboard, runs the lint on the copies and expects exit 1 with exactly the problem lines the case
names added to those of the unbroken copies (the baseline, which is empty once every metric the
dashboards use is exported).
Environment: PRISM_SOURCE_DIR (the repository root), PRISM_PROMTOOL (promtool, for the parse check).
"""
import copy
import json
import os
import subprocess
import sys
import tempfile
import unittest

SRC = os.environ.get("PRISM_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
LINT = os.path.join(SRC, "tests", "deploy", "lint_dashboards.py")
GRAFANA = os.path.join(SRC, "deploy", "grafana")
RULES = os.path.join(SRC, "deploy", "prometheus", "prism-rules.yml")
FILES = ["prism-service.json", "prism-job.json", "prism-agents.json"]
PROMTOOL = os.environ.get("PRISM_PROMTOOL", "/usr/bin/promtool")


def load(name):
    with open(os.path.join(GRAFANA, name), encoding="utf-8") as f:
        return json.load(f)


def run_lint(boards):
    """Writes boards (file name -> dashboard) and lints them: (exit status, problem lines)."""
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for name in FILES:
            path = os.path.join(tmp, name)
            with open(path, "w", encoding="utf-8") as f:
                json.dump(boards[name], f)
            paths.append(path)
        r = subprocess.run([sys.executable, LINT, "--source-dir", SRC, "--rules", RULES, "--promtool", PROMTOOL] + paths,
                           capture_output=True, text=True, timeout=120, check=False)
    lines = r.stdout.splitlines()
    return r.returncode, set(lines[:-1]), lines[-1] if lines else ""


def first_panel(d, ptype):
    return next(p for p in d["panels"] if p["type"] == ptype)


class LintCatches(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.boards = {name: load(name) for name in FILES}
        rc, cls.baseline, summary = run_lint(cls.boards)
        print(f"baseline: {summary}", file=sys.stderr)
        for line in sorted(cls.baseline):
            print(f"  baseline problem: {line}", file=sys.stderr)

    def broken(self, name, change, expected):
        boards = copy.deepcopy(self.boards)
        change(boards[name])
        rc, problems, _ = run_lint(boards)
        self.assertEqual(rc, 1)
        self.assertEqual(problems - self.baseline, set(expected))

    def test_hard_coded_datasource_uid(self):
        def change(d):
            p = first_panel(d, "stat")
            p["datasource"] = {"type": "prometheus", "uid": "P1809F7CD0C75ACF3"}
        self.broken("prism-service.json", change, [
            "prism-service.json: panel 'Ready': datasource is {'type': 'prometheus', 'uid': 'P1809F7CD0C75ACF3'}, "
            "expected {'type': 'prometheus', 'uid': '${datasource}'}",
            "prism-service.json: dashboard: hard-coded uid 'P1809F7CD0C75ACF3' at panels/1/datasource/uid"])

    def test_target_datasource(self):
        def change(d):
            first_panel(d, "stat")["targets"][0]["datasource"] = {"type": "prometheus", "uid": "${DS_PROM}"}
        self.broken("prism-job.json", change, [
            "prism-job.json: panel 'Map version': target A: datasource is {'type': 'prometheus', 'uid': '${DS_PROM}'}, "
            "expected {'type': 'prometheus', 'uid': '${datasource}'}",
            "prism-job.json: dashboard: hard-coded uid '${DS_PROM}' at panels/1/targets/0/datasource/uid"])

    def test_unknown_metric(self):
        def change(d):
            first_panel(d, "stat")["targets"][0]["expr"] = 'sum(prism_no_such_metric_total{instance=~"$instance"})'
        self.broken("prism-service.json", change, [
            "prism-service.json: panel 'Ready': metric prism_no_such_metric_total is not exported by the binaries "
            "nor recorded: sum(prism_no_such_metric_total{instance=~\"$instance\"})"])

    def test_unknown_metric_in_variable(self):
        def change(d):
            v = next(v for v in d["templating"]["list"] if v["name"] == "job")
            v["query"] = "label_values(prism_job_info, exported_job)"
        self.broken("prism-job.json", change, [
            "prism-job.json: variable job: metric prism_job_info is not exported by the binaries nor recorded: "
            "label_values(prism_job_info, exported_job)"])

    def test_duplicate_id_and_grid(self):
        def change(d):
            stats = [p for p in d["panels"] if p["type"] == "stat"]
            stats[1]["id"] = stats[0]["id"]
            stats[0]["gridPos"]["x"] = 22
        self.broken("prism-service.json", change, [
            "prism-service.json: panel 'Jobs': id 2 is used twice",
            "prism-service.json: panel 'Ready': gridPos {'h': 4, 'w': 4, 'x': 22, 'y': 1} is outside the 24 columns"])

    def test_rate_interval(self):
        def change(d):
            p = next(p for p in d["panels"] if p["title"] == "Reconnects")
            p["targets"][0]["expr"] = p["targets"][0]["expr"].replace("[$__rate_interval]", "[5m]")
            self.expr = p["targets"][0]["expr"]
        self.expr = None
        boards = copy.deepcopy(self.boards)
        change(boards["prism-agents.json"])
        rc, problems, _ = run_lint(boards)
        self.assertEqual(rc, 1)
        self.assertEqual(problems - self.baseline,
                         {f"prism-agents.json: panel 'Reconnects': rate() over [5m], expected [$__rate_interval]: {self.expr}"})

    def test_schema_and_datasource_variable(self):
        def change(d):
            d["schemaVersion"] = 39
            d["templating"]["list"] = [v for v in d["templating"]["list"] if v["name"] != "datasource"]
        self.broken("prism-job.json", change, [
            "prism-job.json: dashboard: schemaVersion is 39, expected 42",
            "prism-job.json: templating: no variable `datasource` of type datasource with query prometheus"])

    def test_unknown_variable_and_missing_description(self):
        def change(d):
            p = next(p for p in d["panels"] if p["title"] == "Precision mix")
            p["targets"][0]["expr"] = 'sum by (precision) (prism_blocks{exported_job="$prism_job"})'
            del p["description"]
        self.broken("prism-job.json", change, [
            "prism-job.json: panel 'Precision mix': no description",
            "prism-job.json: panel 'Precision mix': unknown variable $prism_job: "
            "sum by (precision) (prism_blocks{exported_job=\"$prism_job\"})"])

    def test_parse_error(self):
        def change(d):
            p = next(p for p in d["panels"] if p["title"] == "Precision mix")
            p["targets"][0]["expr"] = 'sum by (precision) ((prism_blocks{exported_job="$job"})'
        self.broken("prism-job.json", change, [
            "prism-job.json: panel 'Precision mix': does not parse (1:53: parse error: unclosed left parenthesis): "
            "sum by (precision) ((prism_blocks{exported_job=\"$job\"})"])

    def test_not_json(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "prism-job.json")
            with open(path, "w", encoding="utf-8") as f:
                f.write('{"panels": [')
            r = subprocess.run([sys.executable, LINT, "--source-dir", SRC, path], capture_output=True, text=True,
                               timeout=120, check=False)
        self.assertEqual(r.returncode, 1)
        self.assertTrue(r.stdout.startswith("prism-job.json: file: not valid JSON:"), r.stdout)


if __name__ == "__main__":
    unittest.main(verbosity=2)
