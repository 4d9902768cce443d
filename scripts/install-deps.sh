#!/usr/bin/env bash
# Installs the Debian 12 packages that Prism's build, tests and demo need, and nothing when
# they are all there already (one dpkg-query per package, no apt-get update).
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config git ca-certificates curl
  libjansson-dev libcunit1-dev libprotobuf-c-dev protobuf-c-compiler
  libmicrohttpd-dev libsqlite3-dev python3
  libgrpc-dev protobuf-compiler python3-grpcio python3-protobuf prometheus libcurl4-openssl-dev zlib1g-dev wrk openssl
  python3-numpy python3-torch
  libopenmpi-dev openmpi-bin
  # The fuzz targets (fuzz/, -DPRISM_FUZZ=ON): clang, and libFuzzer, which is in clang's runtime
  # package, only recommended by clang (and so not installed by --no-install-recommends).
  clang libclang-rt-14-dev
  # The dashboard's browser tests (web/): Debian's Chromium, driven by playwright-core from npm.
  chromium
  # The Helm chart's renderer for the tests (tests/deploy/helm_render): Go's text/template with
  # Sprig, built in GOPATH mode against Debian's Go packages.
  golang-go golang-github-masterminds-sprig-dev golang-gopkg-yaml.v3-dev
  # The deploy tests (tests/deploy/, the real-Prometheus test) read YAML manifests and rules.
  python3-yaml
)
# kubectl renders the kustomize base deploy/k8s in the tests: Debian's (1.20) when there is none;
# a newer kubectl from elsewhere is kept as it is.
command -v kubectl >/dev/null 2>&1 || PACKAGES+=(kubernetes-client)
# Node.js and npm build the dashboard (web/) and run the OpenAPI validator and the browser tests.
# Debian's when there is none; a Node.js from elsewhere (NodeSource ships npm inside its nodejs
# package) is kept as it is.
command -v node >/dev/null 2>&1 || PACKAGES+=(nodejs)
command -v npm >/dev/null 2>&1 || PACKAGES+=(npm)

die() {
  echo "install-deps: $*" >&2
  exit 1
}

if ! command -v dpkg-query >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
  die "this script needs a Debian-based system with apt-get and dpkg (Debian 12 is supported);" \
      "install these packages or their equivalents by hand: ${PACKAGES[*]}"
fi

missing=()
for pkg in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  if [[ "$status" != "install ok installed" ]]; then
    missing+=("$pkg")
  fi
done

# The dashboard's npm packages, exactly as web/package-lock.json pins them, whenever the lockfile
# changed since the last `npm ci` (npm's registry is the only network this needs).
npm_ci() {
  local web lock stamp want
  web="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/web"
  lock="$web/package-lock.json" stamp="$web/node_modules/.prism-lock.sha256"
  want=$(sha256sum "$lock" | cut -d' ' -f1)
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    echo "install-deps: web/node_modules matches web/package-lock.json"
    return 0
  fi
  local major
  major=$(node -p 'process.versions.node.split(".")[0]')
  ((major >= 18)) || die "Node.js $(node --version) is too old for the dashboard; 18 or newer is needed"
  echo "install-deps: npm ci in web/"
  (cd "$web" && npm ci --no-audit --no-fund --loglevel=error) || die "npm ci in web/ failed"
  echo "$want" >"$stamp"
}

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#PACKAGES[@]} packages are installed"
  npm_ci
  exit 0
fi

sudo=()
if ((EUID != 0)); then
  if command -v sudo >/dev/null 2>&1; then
    sudo=(sudo)
  else
    die "not running as root and sudo is not available; run as root or install: ${missing[*]}"
  fi
fi

echo "install-deps: installing ${missing[*]}"
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y -q --no-install-recommends "${missing[@]}"
# Only promtool (from Debian's prometheus package) is wanted, for checking /metrics in the tests;
# where systemd runs, the package also starts a Prometheus server: stop and disable it again.
if [[ " ${missing[*]} " == *" prometheus "* ]] && [[ -d /run/systemd/system ]] &&
  command -v systemctl >/dev/null 2>&1; then
  echo "install-deps: stopping the prometheus service the package started (only promtool is used)"
  "${sudo[@]}" systemctl disable --now prometheus >/dev/null 2>&1 || true
fi
npm_ci
echo "install-deps: done"
