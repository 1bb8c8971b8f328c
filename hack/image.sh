#!/usr/bin/env bash
# Builds tenantry's container image without a container engine: a
# multi-arch OCI image index (linux/amd64, linux/arm64) written as an OCI
# image layout and as an archive of it. The same image the Containerfile
# builds with docker, podman or buildah: one static binary at /tenantry,
# Mozilla's CA roots at /etc/ssl/certs/ca-certificates.crt, user 65532,
# nothing else.
#
# How, and why these tools:
# - The binaries are static musl builds (cargo, the rustup targets
#   x86_64- and aarch64-unknown-linux-musl, whose C runtime ships with
#   Rust), linked for arm64 by Debian's aarch64-linux-gnu-gcc, the same
#   cross toolchain the Containerfile's builder uses. No emulation, no
#   engine, no download outside crates.io, rustup and Debian.
# - The layout is written by `tenantry-image` (image/), a few hundred lines
#   over the tar and flate2 crates, rather than by crane or umoci: it needs
#   no registry (crane builds indexes by pushing) and it controls every
#   byte, which is what makes two builds of one commit give one digest
#   (sorted entries, 0:0 owners, the commit time everywhere, gzip without a
#   timestamp, sorted JSON keys). The e2e pod runner reads layouts with it.
# - Sources are copied (only files git knows) to a fixed folder in the
#   cache and compiled there with path prefixes remapped, so the binary does
#   not depend on where the repository was cloned, and fresh clones (CI)
#   reuse the compiled dependencies.
#
# Usage: hack/image.sh [--platforms linux/amd64,linux/arm64] [--out DIR]
# Writes DIR/layout/ (OCI layout, tag = version), DIR/tenantry-<version>.oci.tar,
# DIR/digest (the index digest, sha256:…); DIR defaults to out/image.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${TENANTRY_CACHE:-$HOME/.cache/tenantry}/image"
platforms="linux/amd64,linux/arm64"
out="$root/out/image"
while [[ $# -gt 0 ]]; do
	case "$1" in
	--platforms) platforms="$2"; shift 2 ;;
	--out) out="$2"; shift 2 ;;
	*) echo "usage: $0 [--platforms linux/amd64,linux/arm64] [--out DIR]" >&2; exit 2 ;;
	esac
done
started=$SECONDS

cd "$root"
version="v$(cargo metadata --no-deps --format-version 1 |
	python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "tenantry-provider"))')"
revision="$(git rev-parse HEAD)"
if [[ -n "$(git status --porcelain --untracked-files=normal)" ]]; then
	revision+="-dirty"
fi
created="$(git log -1 --format=%ct)"
source_url="$(cargo metadata --no-deps --format-version 1 |
	python3 -c 'import json,sys; print(next(p["repository"] for p in json.load(sys.stdin)["packages"] if p["name"] == "tenantry-provider"))')"

rust_target() {
	case "$1" in
	linux/amd64) echo x86_64-unknown-linux-musl ;;
	linux/arm64) echo aarch64-unknown-linux-musl ;;
	*) echo "unsupported platform $1" >&2; return 1 ;;
	esac
}

# Toolchain: the musl targets, and the arm64 cross compiler (ring has C and
# assembly) from Debian when this machine can install it.
IFS=, read -r -a wanted <<<"$platforms"
installed="$(rustup target list --installed)"
for platform in "${wanted[@]}"; do
	target="$(rust_target "$platform")"
	grep -qx "$target" <<<"$installed" || rustup target add "$target"
	if [[ "$platform" == linux/arm64 ]] && ! command -v aarch64-linux-gnu-gcc >/dev/null; then
		if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
			echo "==> installing Debian's aarch64 cross compiler"
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
				gcc-aarch64-linux-gnu libc6-dev-arm64-cross >/dev/null ||
				{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
					--no-install-recommends gcc-aarch64-linux-gnu libc6-dev-arm64-cross >/dev/null; }
		else
			echo "linux/arm64 needs aarch64-linux-gnu-gcc (Debian: gcc-aarch64-linux-gnu)" >&2
			exit 1
		fi
	fi
done

cargo build --quiet --locked -p tenantry-image
tool="$root/target/debug/tenantry-image"

mkdir -p "$cache"
exec 9>"$cache/lock"
flock 9
src="$cache/src"
git ls-files -z --cached --others --exclude-standard | "$tool" sync-tree --to "$src"

binaries=()
for platform in "${wanted[@]}"; do
	target="$(rust_target "$platform")"
	echo "==> building tenantry $version ($revision) for $platform"
	build_start=$SECONDS
	(
		cd "$src"
		export CARGO_TARGET_DIR="$cache/target"
		export TENANTRY_REVISION="$revision"
		export SOURCE_DATE_EPOCH="$created"
		export CARGO_PROFILE_RELEASE_STRIP=symbols
		export RUSTFLAGS="-C target-feature=+crt-static --remap-path-prefix=$src=/tenantry --remap-path-prefix=${CARGO_HOME:-$HOME/.cargo}=/cargo"
		export CC_x86_64_unknown_linux_musl=gcc
		export CC_aarch64_unknown_linux_musl=aarch64-linux-gnu-gcc
		export AR_aarch64_unknown_linux_musl=aarch64-linux-gnu-ar
		export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER=aarch64-linux-gnu-gcc
		cargo build --quiet --release --locked --target "$target" -p tenantry-provider --bin tenantry
	)
	echo "    built in $((SECONDS - build_start))s"
	binaries+=(--binary "$platform=$cache/target/$target/release/tenantry")
done

mkdir -p "$out"
digest="$("$tool" build --out "$out/layout" --archive "$out/tenantry-$version.oci.tar" \
	"${binaries[@]}" --version "$version" --revision "$revision" --created "$created" \
	--source "$source_url")"
echo "$digest" >"$out/digest"
echo "tenantry $version image $digest ($platforms) in $out ($((SECONDS - started))s)"
