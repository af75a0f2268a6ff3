#!/usr/bin/env bash
# images/build.sh: build berth's sandbox images offline (no registry needed).
#
#   images/build.sh [-f|--force] [--check] [base|minimal|dev|all ...]
#
# berth/base    Debian bookworm minbase (debootstrap) + images/base/packages.txt
# berth/minimal busybox-static on an otherwise empty root filesystem
# berth/dev     berth/base's root filesystem + images/dev/packages.txt
#               (compilers: build-essential, nodejs/npm, golang-go)
# berth/e2b     berth/base with E2B's base-template conventions: user `user`
#               (uid 1000, home and working directory /home/user), `python`
#
# Without an IMAGE argument, base, minimal and e2b are built (what the tests
# need; `make images`); dev only when named (`make images-dev`) or with all.
#
# Every image is tagged berth/NAME:<recipe hash> and berth/NAME:latest and
# labelled dev.berth.image.recipe=<recipe hash>. The hash covers this script,
# everything under images/NAME/ and the external inputs (Debian suite and
# architecture, busybox-static version). When an image with the current hash
# exists, nothing is done. The root filesystem tarball is cached under
# $BERTH_IMAGES_CACHE (default ${XDG_CACHE_HOME:-~/.cache}/berth/images), so
# a removed image is re-imported in seconds. See images/README.md.
set -euo pipefail
umask 022

IMAGES_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE_DIR=${BERTH_IMAGES_CACHE:-${XDG_CACHE_HOME:-${HOME:-$(cd ~ && pwd)}/.cache}/berth/images}
REPO=berth
SUITE=bookworm
LABEL=dev.berth.image
RECIPES=(base minimal dev e2b)
DEFAULT_RECIPES=(base minimal e2b)
PATH_DEFAULT=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

ARGS=("$@")
FORCE=0
CHECK=0
PARTIAL=""     # tarball being written, removed on failure
WORK=""        # temporary build directory, removed on exit
MADE=" "       # tarballs built by this run (not rebuilt again under --force)
TARBALL=""     # set by ensure_tarball
SUMMARY=()     # one line per image, printed at the end

log() { printf '==> %s\n' "$*" >&2; }
die() { printf 'images/build.sh: error: %s\n' "$*" >&2; exit 1; }
now_ms() { date +%s%3N; }

usage() {
	cat <<EOF
usage: images/build.sh [-f|--force] [--check] [IMAGE ...]

Builds the berth sandbox images offline. IMAGE is one of: ${RECIPES[*]}, or
all for every one (default: ${DEFAULT_RECIPES[*]}). An image whose recipe hash
is unchanged is skipped. berth/dev is built from berth/base's cached root
filesystem, so it builds base's first if needed.

  -f, --force  rebuild from scratch, ignoring the existing image and the
               cached root filesystem tarball
  --check      build nothing; report each image as up to date, stale or
               missing and exit 1 unless all are up to date
  -h, --help   show this help

Environment:
  BERTH_IMAGES_CACHE   cache directory (default: \${XDG_CACHE_HOME:-~/.cache}/berth/images)
  BERTH_DEBIAN_MIRROR  Debian mirror for berth/base and berth/dev (default: the
                       one apt uses on this machine, read from
                       /etc/apt/sources.list{,.d})
EOF
}

# mounts_under DIR prints the mount points below DIR, deepest first.
mounts_under() {
	awk -v p="$1/" 'index($2, p) == 1 { print $2 }' /proc/mounts | sort -r
}

cleanup() {
	local rc=$? m
	[[ -z $PARTIAL ]] || rm -f "$PARTIAL"
	if [[ -n $WORK && -d $WORK ]]; then
		# our /proc, and whatever an interrupted debootstrap left mounted
		for m in $(mounts_under "$WORK"); do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
		if [[ -n $(mounts_under "$WORK") ]]; then
			printf 'images/build.sh: warning: still mounted below %s; not removing it\n' "$WORK" >&2
		else
			rm -rf --one-file-system "$WORK"
		fi
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

require_root() {
	[[ $EUID -eq 0 ]] || die "$1 needs root (debootstrap, chroot, mount); run: sudo $0 ${ARGS[*]}"
}

# ensure_pkgs PKG... installs the Debian packages that are not installed yet.
ensure_pkgs() {
	local missing=() p
	for p in "$@"; do
		[[ $(dpkg-query -W -f='${Status}' "$p" 2>/dev/null) == "install ok installed" ]] || missing+=("$p")
	done
	((${#missing[@]})) || return 0
	[[ $EUID -eq 0 ]] || die "missing host packages: ${missing[*]} (run: sudo apt-get install -y ${missing[*]})"
	command -v apt-get >/dev/null || die "missing host packages: ${missing[*]}, and apt-get is not available"
	log "installing host packages: ${missing[*]}"
	local out
	out=$(DEBIAN_FRONTEND=noninteractive apt-get update -qq 2>&1) || { printf '%s\n' "$out" >&2; die "apt-get update failed"; }
	out=$(DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" 2>&1) ||
		{ printf '%s\n' "$out" >&2; die "apt-get install ${missing[*]} failed"; }
}

# apt_source_uri SUITE prints the URI of the first enabled "deb" source for
# SUITE configured for apt on this machine (one-line and deb822 formats, in
# the order apt reads them). Prints nothing if there is none.
apt_source_uri() {
	local suite=$1 f
	local files=()
	[[ -f /etc/apt/sources.list ]] && files+=(/etc/apt/sources.list)
	for f in /etc/apt/sources.list.d/*; do
		[[ -f $f && ( $f == *.list || $f == *.sources ) ]] && files+=("$f")
	done
	for f in "${files[@]}"; do
		if [[ $f == *.list ]]; then
			awk -v s="$suite" '{ sub(/#.*/, ""); gsub(/\[[^]]*\]/, " ") }
				$1 == "deb" && $3 == s { print $2; found = 1; exit }
				END { exit !found }' "$f" && return 0
		else
			awk -v s="$suite" '
				function has(list, w,   n, a, i) { n = split(list, a, /[ \t]+/); for (i = 1; i <= n; i++) if (a[i] == w) return 1; return 0 }
				BEGIN { RS = "" }
				{
					types = ""; uris = ""; suites = ""; enabled = "yes"
					n = split($0, lines, "\n")
					for (i = 1; i <= n; i++) {
						if (lines[i] ~ /^[ \t]*#/ || lines[i] !~ /:/) continue
						key = tolower(substr(lines[i], 1, index(lines[i], ":") - 1))
						val = substr(lines[i], index(lines[i], ":") + 1)
						gsub(/^[ \t]+|[ \t]+$/, "", val)
						if (key == "types") types = val; else if (key == "uris") uris = val
						else if (key == "suites") suites = val; else if (key == "enabled") enabled = tolower(val)
					}
					if (enabled != "no" && has(types, "deb") && has(suites, s)) { split(uris, u, /[ \t]+/); print u[1]; found = 1; exit }
				}
				END { exit !found }' "$f" && return 0
		fi
	done
	return 0
}

debian_mirror() {
	local m=${BERTH_DEBIAN_MIRROR:-}
	[[ -n $m ]] || m=$(apt_source_uri "$SUITE")
	[[ -n $m ]] || die "no apt source for Debian '$SUITE' in /etc/apt/sources.list{,.d}; set BERTH_DEBIAN_MIRROR (e.g. the URI of your Debian mirror or apt proxy)"
	printf '%s\n' "${m%/}"
}

# apt_proxy_env exports http(s)_proxy from apt's configuration (if set there
# and not in the environment), so debootstrap's wget uses the same proxy.
apt_proxy_env() {
	local HTTP_PROXY_APT="" HTTPS_PROXY_APT=""
	eval "$(apt-config shell HTTP_PROXY_APT Acquire::http::Proxy HTTPS_PROXY_APT Acquire::https::Proxy 2>/dev/null || true)"
	if [[ -z ${http_proxy:-} && -n $HTTP_PROXY_APT && $HTTP_PROXY_APT != DIRECT ]]; then
		export http_proxy=$HTTP_PROXY_APT
		log "using apt's HTTP proxy $http_proxy"
	fi
	if [[ -z ${https_proxy:-} && -n $HTTPS_PROXY_APT && $HTTPS_PROXY_APT != DIRECT ]]; then
		export https_proxy=$HTTPS_PROXY_APT
	fi
}

arch() { dpkg --print-architecture; }

busybox_version() {
	dpkg-query -W -f='${Version}' busybox-static 2>/dev/null || echo "not-installed"
}

# packages NAME prints images/NAME/packages.txt, one package per line.
packages() {
	sed -e 's/#.*//' -e 's/[[:space:]]//g' "$IMAGES_DIR/$1/packages.txt" | { grep -v '^$' || true; }
}

# packages_csv NAME prints images/NAME/packages.txt as a comma-separated list.
packages_csv() { packages "$1" | paste -sd, -; }

# chroot_apt ROOT LOG ARGS... runs apt-get ARGS inside ROOT (with /proc
# mounted, services kept from starting, apt's Check-Valid-Until from the
# host, and $CACHE_DIR/debs as the package cache, so a rebuild downloads
# nothing it already has). Output goes to LOG; on failure its tail is shown.
chroot_apt() {
	local root=$1 log=$2 cvu=""
	shift 2
	eval "$(apt-config shell cvu Acquire::Check-Valid-Until 2>/dev/null || true)"
	printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
	chmod 0755 "$root/usr/sbin/policy-rc.d"
	mkdir -p "$CACHE_DIR/debs" "$root/var/cache/apt/archives"
	mount -t proc proc "$root/proc" # unmounted by cleanup if we fail
	mount --bind "$CACHE_DIR/debs" "$root/var/cache/apt/archives"
	local rc=0
	chroot "$root" env DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8 apt-get -qq \
		-o "Acquire::Check-Valid-Until=${cvu:-true}" -o Dpkg::Options::=--force-confold "$@" >>"$log" 2>&1 || rc=$?
	umount "$root/var/cache/apt/archives"
	umount "$root/proc"
	rm -f "$root/usr/sbin/policy-rc.d"
	if ((rc)); then
		tail -n 30 "$log" >&2
		die "apt-get $* inside the rootfs failed (log above)"
	fi
}

# clean_rootfs ROOT removes what an image does not need: apt lists and
# caches, logs, manuals, info pages, translations, docs (but copyright
# files), the build host's resolv.conf/hostname/machine-id and /dev nodes.
clean_rootfs() {
	local root=$1
	log "cleaning apt lists, caches, logs, docs and manuals"
	rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin \
		"$root"/var/cache/apt/archives/*.deb "$root"/var/cache/apt/archives/partial/* \
		"$root"/var/cache/debconf/*-old "$root"/var/lib/dpkg/*-old \
		"$root"/var/cache/ldconfig/aux-cache "$root"/tmp/* "$root"/var/tmp/* \
		"$root"/usr/share/info/* "$root"/debootstrap "$root"/root/.cache
	find "$root/var/log" -type f -delete
	find "$root/usr/share/man" -type f -delete 2>/dev/null || true
	find "$root/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete 2>/dev/null || true
	find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} + 2>/dev/null || true
	# Docker provides these per container; do not ship the build host's.
	rm -f "$root/etc/resolv.conf" "$root/etc/hostname" "$root/etc/machine-id"
	# Docker mounts a fresh /dev; drop the device nodes debootstrap made.
	find "$root/dev" -mindepth 1 -delete
}

# --- recipes ---------------------------------------------------------------
# A recipe NAME is: a directory images/NAME/ (hashed; an optional rootfs/
# overlay copied into the image last) and four functions:
#   inputs_NAME          print external inputs that belong in the recipe hash
#   rootfs_NAME DIR      populate the root filesystem DIR
#   changes_NAME         print `docker import --change` lines (one per line)
#   smoke_NAME           print the command (argv, one per line) that must
#                        succeed in a fresh container of the image

inputs_base() {
	printf 'suite %s\narch %s\n' "$SUITE" "$(arch)"
}

changes_base() {
	printf '%s\n' "ENV PATH=$PATH_DEFAULT" "ENV LANG=C.UTF-8" "WORKDIR /workspace" 'CMD ["/bin/bash"]' \
		"LABEL $LABEL.debian-suite=$SUITE"
}

# The smoke test checks what agents rely on most; a fuller test (a venv with
# pip, http.server) is TestBaseImageTools in pkg/runtime/docker.
smoke_base() {
	printf '%s\n' bash -c 'set -e
git --version >/dev/null; python3 -c "import json, sqlite3, urllib.request, http.server, venv, ensurepip"
for t in curl jq rg make patch diff find less unzip xz; do command -v $t >/dev/null || { echo "missing $t" >&2; exit 1; }; done
ps -p 1 >/dev/null; id -u sandbox | grep -qx 1000; test "$(stat -c %u:%g /workspace)" = 1000:1000'
}

rootfs_base() {
	local root=$1 mirror security updates pkgs
	require_root "building berth/base"
	ensure_pkgs debootstrap debian-archive-keyring wget
	command -v chroot >/dev/null || die "chroot not found"
	apt_proxy_env
	mirror=$(debian_mirror)
	security=$(apt_source_uri "$SUITE-security")
	updates=$(apt_source_uri "$SUITE-updates")
	pkgs=$(packages_csv base)
	[[ -n $pkgs ]] || die "images/base/packages.txt lists no packages"

	mkdir -p "$CACHE_DIR/debs"
	log "debootstrap --variant=minbase $SUITE from $mirror (+ $pkgs)"
	debootstrap --variant=minbase --include="$pkgs" --cache-dir="$CACHE_DIR/debs" \
		"$SUITE" "$root" "$mirror" >"$WORK/debootstrap.log" 2>&1 || {
		tail -n 30 "$WORK/debootstrap.log" >&2
		[[ -f $root/debootstrap/debootstrap.log ]] && tail -n 30 "$root/debootstrap/debootstrap.log" >&2
		die "debootstrap failed (log above)"
	}

	# apt sources inside the image: the same mirror(s) this machine uses.
	rm -f "$root/etc/apt/sources.list"
	{
		printf 'Types: deb\nURIs: %s\nSuites: %s%s\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
			"$mirror" "$SUITE" "${updates:+ $SUITE-updates}"
		[[ -z $security ]] ||
			printf '\nTypes: deb\nURIs: %s\nSuites: %s-security\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
				"${security%/}" "$SUITE"
	} >"$root/etc/apt/sources.list.d/debian.sources"

	if [[ -n $security || -n $updates ]]; then
		log "applying $SUITE${updates:+ $SUITE-updates}${security:+ $SUITE-security} updates"
		chroot_apt "$root" "$WORK/upgrade.log" update
		chroot_apt "$root" "$WORK/upgrade.log" -y upgrade
	fi

	log "adding user sandbox (uid 1000), /workspace owned by it"
	chroot "$root" useradd --uid 1000 --user-group --create-home --shell /bin/bash sandbox
	install -d -m 0755 -o 1000 -g 1000 "$root/workspace"
	user_installs "$root"
	clean_rootfs "$root"
}

# user_installs lets the sandbox user install what agents install most, with
# no root: `pip install X` and `npm install -g X` (berth/dev) write to
# /usr/local, which is made the sandbox user's, and Debian's
# EXTERNALLY-MANAGED marker goes, so pip installs there instead of refusing
# (what Debian protects, /usr/lib/python3/dist-packages, stays apt's, and
# /usr/local is what pip's Debian scheme and npm's global prefix use).
# Inside one sandbox the lease's user and root belong to the same tenant;
# apt-get stays root's (--user root leases or exec -u root).
user_installs() {
	local root=$1
	rm -f "$root"/usr/lib/python3*/EXTERNALLY-MANAGED
	install -d "$root/usr/local/lib/node_modules"
	chown -R 1000:1000 "$root/usr/local"
}

inputs_minimal() {
	printf 'busybox-static %s\narch %s\n' "$(busybox_version)" "$(arch)"
}

changes_minimal() {
	printf '%s\n' "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
		"WORKDIR /workspace" 'CMD ["/bin/sh"]' "LABEL $LABEL.busybox-version=$(busybox_version)"
}

smoke_minimal() { printf '%s\n' sh -c 'echo ok >/dev/null && ls /workspace >/dev/null && id sandbox >/dev/null && test "$(stat -c %u:%g /workspace)" = 1000:1000'; }

rootfs_minimal() {
	local root=$1 bb applet
	ensure_pkgs busybox-static
	bb=$(dpkg-query -L busybox-static | grep -E '/s?bin/busybox$' | head -n1 || true)
	[[ -n $bb && -x $bb ]] || bb=/bin/busybox
	[[ -x $bb ]] || die "busybox-static is installed but its binary was not found"
	if ldd "$bb" >/dev/null 2>&1; then die "$bb is dynamically linked; berth/minimal needs busybox-static"; fi

	log "busybox-static $(busybox_version): $bb + applet links"
	install -d -m 0755 "$root"/{bin,sbin,usr/bin,usr/sbin,usr/local/bin,etc,dev,proc,sys,run,var}
	install -d -m 0700 "$root/root"
	install -d -m 1777 "$root/tmp" "$root/var/tmp"
	install -d -m 0755 -o 1000 -g 1000 "$root/home/sandbox" "$root/workspace" 2>/dev/null ||
		install -d -m 0755 "$root/home/sandbox" "$root/workspace" # not root: ownership fixed in the tarball
	install -m 0755 "$bb" "$root/bin/busybox"
	# `busybox --list-full` prints each applet with its install path
	# (bin/sh, usr/bin/awk, ...): the same layout as `busybox --install -s`.
	while read -r applet; do
		[[ -n $applet && $applet != bin/busybox && $applet != linuxrc ]] || continue
		install -d -m 0755 "$root/$(dirname "$applet")"
		ln -sf /bin/busybox "$root/$applet"
	done < <("$bb" --list-full)
	[[ -L $root/bin/sh ]] || die "busybox has no sh applet"
}

# berth/dev: berth/base's root filesystem (its cached tarball, built first
# if missing) plus images/dev/packages.txt installed with apt-get. Its recipe
# hash includes base's, so a change to base rebuilds dev too.
inputs_dev() {
	printf 'base %s\narch %s\n' "$(recipe_hash base)" "$(arch)"
}

changes_dev() { changes_base; }

smoke_dev() {
	printf '%s\n' bash -c 'set -e
gcc --version >/dev/null; g++ --version >/dev/null; make --version >/dev/null
node --version >/dev/null; npm --version >/dev/null; go version >/dev/null
python3 --version >/dev/null; id -u sandbox | grep -qx 1000; test "$(stat -c %u:%g /workspace)" = 1000:1000'
}

# prereq_dev runs before dev's build directory is made: the base tarball.
prereq_dev() { ensure_tarball base "$(recipe_hash base)"; }

rootfs_dev() {
	local root=$1 base_tar pkgs=()
	require_root "building berth/dev"
	command -v chroot >/dev/null || die "chroot not found"
	apt_proxy_env
	base_tar=$CACHE_DIR/base-$(recipe_hash base).tar
	[[ -s $base_tar ]] || die "base root filesystem $base_tar is missing"
	mapfile -t pkgs < <(packages dev)
	((${#pkgs[@]})) || die "images/dev/packages.txt lists no packages"

	log "unpacking berth/base's root filesystem $(basename "$base_tar")"
	tar --numeric-owner --same-owner -C "$root" -xpf "$base_tar"
	# Name resolution and the device nodes apt and maintainer scripts use
	# inside the chroot (base ships an empty /dev); clean_rootfs removes them.
	cp -L /etc/resolv.conf "$root/etc/resolv.conf"
	mknod -m 0666 "$root/dev/null" c 1 3
	mknod -m 0666 "$root/dev/zero" c 1 5
	mknod -m 0666 "$root/dev/full" c 1 7
	mknod -m 0666 "$root/dev/random" c 1 8
	mknod -m 0666 "$root/dev/urandom" c 1 9
	mknod -m 0666 "$root/dev/tty" c 5 0
	log "apt-get install --no-install-recommends ${pkgs[*]}"
	chroot_apt "$root" "$WORK/apt.log" update
	chroot_apt "$root" "$WORK/apt.log" -y --no-install-recommends install "${pkgs[@]}"
	user_installs "$root"
	clean_rootfs "$root"
}

# berth/e2b: berth/base's root filesystem (its cached tarball) with E2B's
# base-template conventions, for E2B's SDKs (docs/e2b.md): uid/gid 1000 is
# named `user` (home /home/user, the working directory, where relative
# paths resolve) and keeps `sandbox` as a second name (berth's default user
# of berth/ images), and `python` is python3. No packages are added.
inputs_e2b() {
	printf 'base %s\narch %s\n' "$(recipe_hash base)" "$(arch)"
}

changes_e2b() {
	printf '%s\n' "ENV PATH=$PATH_DEFAULT" "ENV LANG=C.UTF-8" "WORKDIR /home/user" 'CMD ["/bin/bash"]' \
		"LABEL $LABEL.debian-suite=$SUITE"
}

smoke_e2b() {
	printf '%s\n' bash -c 'set -e
test "$(id -un 1000)" = user; id -u sandbox | grep -qx 1000; id -u user | grep -qx 1000
test "$(getent passwd user | cut -d: -f6)" = /home/user; test "$(stat -c %u:%g /home/user)" = 1000:1000
test "$(pwd)" = /home/user; python --version >/dev/null; python3 --version >/dev/null'
}

prereq_e2b() { ensure_tarball base "$(recipe_hash base)"; }

rootfs_e2b() {
	local root=$1 base_tar
	require_root "building berth/e2b"
	command -v chroot >/dev/null || die "chroot not found"
	base_tar=$CACHE_DIR/base-$(recipe_hash base).tar
	[[ -s $base_tar ]] || die "base root filesystem $base_tar is missing"
	log "unpacking berth/base's root filesystem $(basename "$base_tar")"
	tar --numeric-owner --same-owner -C "$root" -xpf "$base_tar"
	log "naming uid 1000 user (home /home/user), sandbox its second name; python is python3"
	chroot "$root" usermod --login user --home /home/user --move-home sandbox
	chroot "$root" groupmod --new-name user sandbox
	chroot "$root" useradd --non-unique --uid 1000 --gid 1000 --no-create-home --home-dir /home/user --shell /bin/bash sandbox
	ln -sf python3 "$root/usr/bin/python"
	clean_rootfs "$root"
}

# --- driver ----------------------------------------------------------------

# recipe_hash NAME prints the sha256 of everything that defines image NAME.
recipe_hash() {
	local name=$1 f
	{
		echo "berth image recipe v1 $name"
		printf 'script %s\n' "$(sha256sum <"$IMAGES_DIR/build.sh" | cut -d' ' -f1)"
		(
			cd "$IMAGES_DIR/$name"
			find . -type f -print0 | LC_ALL=C sort -z | while IFS= read -r -d '' f; do
				printf 'file %s %s %s\n' "$f" "$([[ -x $f ]] && echo 755 || echo 644)" "$(sha256sum <"$f" | cut -d' ' -f1)"
			done
		)
		"inputs_$name"
	} | sha256sum | cut -d' ' -f1
}

# image_recipe REF prints the recipe label of image REF (empty if absent).
image_recipe() {
	docker image inspect --format "{{index .Config.Labels \"$LABEL.recipe\"}}" "$1" 2>/dev/null || true
}

# install_overlay NAME ROOT copies images/NAME/rootfs/ into ROOT (root-owned,
# mode 0755 for executables, 0644 otherwise, whatever the checkout's umask).
install_overlay() {
	local src=$IMAGES_DIR/$1/rootfs root=$2 f
	[[ -d $src ]] || return 0
	(cd "$src" && find . -type f) | LC_ALL=C sort | while read -r f; do
		f=${f#./}
		install -D -m "$([[ -x $src/$f ]] && echo 0755 || echo 0644)" "$src/$f" "$root/$f"
	done
}

# ensure_tarball NAME HASH makes sure the root filesystem tarball of NAME's
# recipe HASH is in the cache (building it unless it is there, or, with
# --force, unless this run built it) and sets TARBALL to its path. (Not a
# command substitution: the build must run in this shell, whose EXIT trap
# unmounts and removes the build directory.)
ensure_tarball() {
	local name=$1 hash=$2 tarball root
	tarball=$CACHE_DIR/$name-$hash.tar
	mkdir -p "$CACHE_DIR"
	if [[ -s $tarball ]] && { ((!FORCE)) || [[ $MADE == *" $tarball "* ]]; }; then
		log "using cached root filesystem $tarball"
		touch "$tarball" # most recently used: kept by the pruning below
		TARBALL=$tarball
		return 0
	fi
	if declare -F "prereq_$name" >/dev/null; then "prereq_$name"; fi
	WORK=$(mktemp -d "$CACHE_DIR/work-$name.XXXXXX")
	root=$WORK/rootfs
	mkdir -p "$root"
	"rootfs_$name" "$root"
	install_overlay "$name" "$root"
	log "writing root filesystem tarball $tarball"
	local owner=()
	[[ $EUID -eq 0 ]] || owner=(--owner=0 --group=0)
	PARTIAL=$tarball.partial
	tar --numeric-owner "${owner[@]}" -C "$root" -cf "$PARTIAL" .
	mv -f "$PARTIAL" "$tarball"
	PARTIAL=""
	rm -rf --one-file-system "$WORK"
	WORK=""
	MADE+="$tarball "
	# keep this tarball and the previous one (switching back is a re-import)
	find "$CACHE_DIR" -maxdepth 1 -name "$name-*.tar" -printf '%T@ %p\n' | sort -rn | tail -n +3 |
		cut -d' ' -f2- | while read -r old; do log "removing old cached tarball $old"; rm -f "$old"; done
	TARBALL=$tarball
}

# summarize NAME STATUS T0 records a line of the final summary: the image's
# size and what was done, in how long.
summarize() {
	local name=$1 what=$2 t0=$3 size
	size=$(docker image inspect --format '{{.Size}}' "$REPO/$name:latest" 2>/dev/null || echo 0)
	SUMMARY+=("$(printf '%-22s %9s  %s in %s' "$REPO/$name:latest" \
		"$(awk -v b="$size" 'BEGIN { printf "%.1f MB", b / 1e6 }')" "$what" \
		"$(awk -v ms="$(($(now_ms) - t0))" 'BEGIN { printf "%.1f s", ms / 1000 }')")")
}

# build NAME builds berth/NAME unless an image with the current recipe exists.
build() {
	local name=$1 hash short ref latest tarball t0 root
	t0=$(now_ms)
	hash=$(recipe_hash "$name")
	short=${hash:0:12}
	ref=$REPO/$name:$short
	latest=$REPO/$name:latest

	if ((CHECK)); then
		local have
		have=$(image_recipe "$latest")
		if [[ $have == "$hash" ]]; then echo "$latest: up to date (recipe $short)"; return 0; fi
		if [[ -z $have ]]; then echo "$latest: missing (recipe $short)"; else echo "$latest: stale (image ${have:0:12}, recipe $short)"; fi
		return 1
	fi

	if ((!FORCE)); then
		if [[ $(image_recipe "$latest") == "$hash" ]]; then
			log "$latest is up to date (recipe $short), skipping"
			summarize "$name" "up to date (recipe $short), checked" "$t0"
			return 0
		fi
		if [[ $(image_recipe "$ref") == "$hash" ]]; then
			log "$ref exists, tagging it $latest"
			docker tag "$ref" "$latest"
			summarize "$name" "re-tagged $ref" "$t0"
			return 0
		fi
	fi

	log "building $ref (recipe $hash)"
	ensure_tarball "$name" "$hash"
	tarball=$TARBALL

	local changes=() c
	while IFS= read -r c; do changes+=(--change "$c"); done < <("changes_$name")
	changes+=(--change "LABEL $LABEL.name=$name" --change "LABEL $LABEL.recipe=$hash")
	log "docker import $ref"
	docker import "${changes[@]}" --message "berth image $name, recipe $hash" "$tarball" "$ref" >/dev/null ||
		die "docker import of $tarball failed"

	local smoke=()
	mapfile -t smoke < <("smoke_$name")
	log "smoke test: docker run --rm --network none $ref$(printf ' %q' "${smoke[@]}")"
	if ! docker run --rm --network none "$ref" "${smoke[@]}" >&2; then
		docker rmi "$ref" >/dev/null 2>&1 || true
		rm -f "$tarball"
		die "smoke test of $ref failed; image and cached tarball removed"
	fi
	docker tag "$ref" "$latest"

	# Untag images of older recipes (an image still used by a container stays).
	local old
	docker image ls --filter "label=$LABEL.name=$name" --format '{{.Repository}}:{{.Tag}}' "$REPO/$name" |
		while read -r old; do
			[[ $old == "$ref" || $old == "$latest" || $old == *'<none>'* ]] && continue
			log "removing old image tag $old"
			docker rmi "$old" >/dev/null 2>&1 || log "could not remove $old (still in use?)"
		done

	local size
	size=$(docker image inspect --format '{{.Size}}' "$ref")
	log "built $latest = $ref: $(awk -v b="$size" 'BEGIN { printf "%.1f MB", b / 1e6 }'), $(awk -v ms="$(($(now_ms) - t0))" 'BEGIN { printf "%.1f s", ms / 1000 }')"
	summarize "$name" "built (recipe $short)" "$t0"
}

main() {
	local targets=() a
	for a in "$@"; do
		case $a in
		-f | --force) FORCE=1 ;;
		--check) CHECK=1 ;;
		-h | --help) usage; exit 0 ;;
		all) targets+=("${RECIPES[@]}") ;;
		-*) usage >&2; die "unknown option: $a" ;;
		*)
			[[ " ${RECIPES[*]} " == *" $a "* ]] || { usage >&2; die "unknown image: $a (known: ${RECIPES[*]})"; }
			targets+=("$a")
			;;
		esac
	done
	((${#targets[@]})) || targets=("${DEFAULT_RECIPES[@]}")

	command -v docker >/dev/null || die "docker CLI not found"
	docker version --format '{{.Server.Version}}' >/dev/null 2>&1 ||
		die "cannot reach the Docker daemon (is it running, and may $(id -un) use it?)"

	if ((CHECK)); then
		local rc=0
		for a in "${targets[@]}"; do build "$a" || rc=1; done
		exit "$rc"
	fi

	mkdir -p "$CACHE_DIR"
	exec 9>"$CACHE_DIR/.lock"
	if ! flock -n 9; then
		log "another images/build.sh is running; waiting for it"
		flock 9
	fi
	local seen=" "
	for a in "${targets[@]}"; do
		[[ $seen == *" $a "* ]] && continue
		seen+="$a "
		build "$a"
	done
	log "images (size as docker images reports it):"
	printf '    %s\n' "${SUMMARY[@]}" >&2
}

main "$@"
