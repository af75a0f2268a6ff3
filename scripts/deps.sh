#!/usr/bin/env bash
# scripts/deps.sh: install the host packages that `make run` and `make test`
# need, only those that are missing (idempotent; run by `make deps`, which
# run, test, e2e, bench and images depend on).
#
#   scripts/deps.sh [--check]
#
# Go and a running Docker Engine (docker.io, containerd, runc) are expected
# to be there already; they are checked, not installed. Everything else is a
# Debian 12 package:
#
#   git                          agent and workspace git tests, `git describe`
#   python3                      upload tests with a whole-body-first client (urllib)
#   python3-pytest               the Python client's tests (clients/python, run by e2e)
#   tmux                         shell e2e tests (drive the CLI in a terminal)
#   util-linux                   unshare, nsenter, flock (images/build.sh)
#   iproute2                     ip, bridge (containerd backend, e2e checks)
#   iptables                     sandbox network rules (containerd backend)
#   containernetworking-plugins  CNI bridge and host-local (containerd backend)
#   debootstrap debian-archive-keyring wget   berth/base (images/build.sh)
#   busybox-static               berth/minimal (images/build.sh)
#   prometheus                   promtool (`promtool check metrics` on /metrics in tests)
#   chromium                     the dashboard's browser test (e2e TestDashboard drives it headless)
#   node-xterm libjs-xterm       the dashboard's browser terminal (scripts/ui-xterm.sh bundles xterm.js)
#   openssl curl                 the Kubernetes test cluster (scripts/k8s/up.sh: certificates, health)
#
# protoc (protobuf-compiler, libprotobuf-dev) is only needed by `make proto`
# and is installed by `make proto-tools`.
#
# With --check nothing is installed: the missing packages are printed and
# the exit status is 1 when there are any. `apt-get update` runs once, and
# only when something is missing. Installing needs root (or sudo).
set -euo pipefail

CHECK=0
case ${1:-} in
--check) CHECK=1 ;;
"") ;;
-h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
*) echo "usage: scripts/deps.sh [--check]" >&2; exit 2 ;;
esac

PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin:/usr/local/go/bin
die() { printf 'scripts/deps.sh: error: %s\n' "$*" >&2; exit 1; }
log() { printf '==> %s\n' "$*" >&2; }

# installed PKG: the Debian package is installed.
installed() { [[ $(dpkg-query -W -f='${Status}' "$1" 2>/dev/null) == "install ok installed" ]]; }
has() { command -v "$1" >/dev/null 2>&1; }

command -v go >/dev/null || die "go not found (install Go (the version in go.mod), https://go.dev/doc/install)"
has docker || die "docker not found: berth needs a Docker Engine (Debian: apt-get install docker.io)"
has dpkg-query && has apt-get || die "this script installs Debian packages with apt-get; on another system install the packages listed in $0 by hand"

need=()
want() { # want PKG PROBE...: PKG is needed unless every probe succeeds
	local pkg=$1 probe
	shift
	for probe in "$@"; do
		if ! eval "$probe"; then
			need+=("$pkg")
			return
		fi
	done
}
want git 'has git'
want python3 'has python3'
want python3-pytest 'installed python3-pytest'
want tmux 'has tmux'
want util-linux 'has unshare' 'has nsenter' 'has flock'
want iproute2 'has ip' 'has bridge'
want iptables 'has iptables'
want containernetworking-plugins '[[ -x /usr/lib/cni/bridge || -x /opt/cni/bin/bridge ]]' '[[ -x /usr/lib/cni/host-local || -x /opt/cni/bin/host-local ]]'
want containerd 'has ctr'
want debootstrap 'has debootstrap'
want debian-archive-keyring 'installed debian-archive-keyring'
want wget 'has wget'
want busybox-static 'installed busybox-static'
want prometheus 'has promtool'
want chromium 'has chromium'
want node-xterm '[[ -f /usr/share/nodejs/xterm/lib/public/Terminal.js ]]'
want libjs-xterm '[[ -f /usr/share/javascript/xterm/addons/fit/fit.js ]]'
want openssl 'has openssl'
want curl 'has curl'

if ((${#need[@]} == 0)); then
	((CHECK)) || log "deps: all present"
	exit 0
fi
if ((CHECK)); then
	printf '%s\n' "${need[@]}"
	exit 1
fi

sudo=()
if [[ $EUID -ne 0 ]]; then
	has sudo || die "missing packages: ${need[*]}; run as root: apt-get install -y ${need[*]}"
	sudo=(sudo)
fi
log "installing missing packages: ${need[*]}"
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
