#!/usr/bin/env bash
# Copies deploy/'s Grafana dashboards (deploy/grafana/*.json) and Prometheus rules
# (deploy/prometheus/prism-rules.yml) into the Helm chart (helm/prism/files/), which can only read
# files inside itself, and removes copies whose original is gone. deploy/ is the original: edit
# there, then run this.
#   scripts/sync-chart-files.sh          copy
#   scripts/sync-chart-files.sh --check  change nothing; exit 1 naming every copy that differs
#                                        (the test test_helm_chart_files_synced runs this), or 77
#                                        when deploy/ has no dashboards and no rules at all
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
check=false
case "${1:-}" in
  "") ;;
  --check) check=true ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

# Pairs of original and copy.
pairs=()
shopt -s nullglob
for f in "$root"/deploy/grafana/*.json; do
  pairs+=("$f" "$root/helm/prism/files/grafana/$(basename "$f")")
done
if [[ -f "$root/deploy/prometheus/prism-rules.yml" ]]; then
  pairs+=("$root/deploy/prometheus/prism-rules.yml" "$root/helm/prism/files/prometheus/prism-rules.yml")
fi
if $check && ((${#pairs[@]} == 0)); then
  echo "sync-chart-files: deploy/ has no dashboards (deploy/grafana/*.json) and no rules" \
       "(deploy/prometheus/prism-rules.yml) yet: nothing to compare"
  exit 77
fi

# Copies in the chart without an original.
stale=()
for f in "$root"/helm/prism/files/grafana/*.json "$root"/helm/prism/files/prometheus/*; do
  rel="${f#"$root"/helm/prism/files/}"
  case "$rel" in
    grafana/*) orig="$root/deploy/$rel" ;;
    prometheus/*) orig="$root/deploy/$rel" ;;
  esac
  [[ -f "$orig" ]] || stale+=("$f")
done

bad=0
for ((i = 0; i < ${#pairs[@]}; i += 2)); do
  src="${pairs[i]}" dst="${pairs[i + 1]}"
  if ! cmp -s "$src" "$dst"; then
    if $check; then
      echo "sync-chart-files: ${dst#"$root"/} differs from ${src#"$root"/} (or is missing)"
      bad=1
    else
      mkdir -p "$(dirname "$dst")"
      cp "$src" "$dst"
      echo "sync-chart-files: copied ${src#"$root"/} to ${dst#"$root"/}"
    fi
  fi
done
for f in "${stale[@]}"; do
  if $check; then
    echo "sync-chart-files: ${f#"$root"/} has no original in deploy/"
    bad=1
  else
    rm -f "$f"
    echo "sync-chart-files: removed ${f#"$root"/} (no original in deploy/)"
  fi
done
if $check; then
  if ((bad)); then
    echo "sync-chart-files: the chart's copies are out of date: run scripts/sync-chart-files.sh"
    exit 1
  fi
  echo "sync-chart-files: helm/prism/files/ matches deploy/ ($((${#pairs[@]} / 2)) files)"
fi
