#!/usr/bin/env bash
# Bounded fuzzing of tenantry's parsers and renderers (fuzz/README.md).
#
# Builds the cargo-fuzz targets in fuzz/ with nightly (debug assertions and
# overflow checks on, AddressSanitizer), then runs each for a fixed time on a
# temporary copy of its seed corpus, so nothing is written into the tree.
# Fails when a target crashes, printing the crashing input and how to replay
# it.
#
#   hack/fuzz.sh                      # every target, 20 s each
#   hack/fuzz.sh --seconds 600 upid   # one target, ten minutes
#   hack/fuzz.sh --dev                # unoptimised build (what CI runs)
#   hack/fuzz.sh --dev --build-only   # build the targets, run none
#
# --dev builds the targets without optimisation: a cold build takes a
# fraction of the optimised one's time, for fewer executions per second, the
# right trade for CI's short bounded run on a fresh machine. Long runs by
# hand should use the default, optimised build.
#
# cargo-fuzz is installed on first use into
# $TENANTRY_CACHE/cargo-fuzz-<version> (default TENANTRY_CACHE:
# ~/.cache/tenantry) and the build goes to $TENANTRY_CACHE/fuzz-target
# (override: TENANTRY_FUZZ_TARGET_DIR), both reused by later runs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

CARGO_FUZZ_VERSION=0.13.2
cache="${TENANTRY_CACHE:-$HOME/.cache/tenantry}"

usage() {
	sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
	echo "Targets: $(all_targets | tr '\n' ' ')"
}

all_targets() {
	for file in fuzz/fuzz_targets/*.rs; do
		basename "$file" .rs
	done
}

seconds=20
# cargo-fuzz's flag for the build and the folder its binaries land in.
profile_flag=()
profile_dir=release
build_only=false
targets=()
while (($#)); do
	case "$1" in
	--seconds)
		seconds="${2:?--seconds needs a number}"
		shift 2
		;;
	--seconds=*)
		seconds="${1#--seconds=}"
		shift
		;;
	--dev)
		profile_flag=(--dev)
		profile_dir=debug
		shift
		;;
	--build-only)
		build_only=true
		shift
		;;
	-h | --help)
		usage
		exit 0
		;;
	-*)
		echo "unknown option $1" >&2
		usage >&2
		exit 2
		;;
	*)
		targets+=("$1")
		shift
		;;
	esac
done
if ! [[ "$seconds" =~ ^[1-9][0-9]*$ ]]; then
	echo "--seconds wants a positive whole number, got $seconds" >&2
	exit 2
fi
known="$(all_targets)"
if ((${#targets[@]} == 0)); then
	mapfile -t targets <<<"$known"
fi
for target in "${targets[@]}"; do
	if ! grep -qx -- "$target" <<<"$known"; then
		echo "no fuzz target $target; targets: $(tr '\n' ' ' <<<"$known")" >&2
		exit 2
	fi
done

# libFuzzer's instrumentation needs nightly; a fresh machine gets it here,
# as CI must install what it needs.
if ! cargo +nightly --version >/dev/null 2>&1; then
	echo "==> installing the nightly toolchain (rustup, minimal profile)"
	rustup toolchain install nightly --profile minimal
fi

# cargo-fuzz, pinned, outside the work tree. `cargo install` would build in
# CARGO_TARGET_DIR if one is set; it gets a scratch directory of its own.
fuzz_root="$cache/cargo-fuzz-$CARGO_FUZZ_VERSION"
if [[ ! -x "$fuzz_root/bin/cargo-fuzz" ]]; then
	echo "==> installing cargo-fuzz $CARGO_FUZZ_VERSION into $fuzz_root"
	env -u CARGO_TARGET_DIR cargo install cargo-fuzz --locked \
		--version "$CARGO_FUZZ_VERSION" --root "$fuzz_root"
fi
export PATH="$fuzz_root/bin:$PATH"
export CARGO_TARGET_DIR="${TENANTRY_FUZZ_TARGET_DIR:-$cache/fuzz-target}"
# No incremental state: with AddressSanitizer it grew by gigabytes per
# changed commit in the shared cache and filled the disk; the few crates a
# commit changes rebuild in minutes without it.
export CARGO_INCREMENTAL=0

# 16 codegen units instead of cargo-fuzz's 1: the provider crate builds in
# parallel, at some cost in executions per second.
build=(cargo +nightly fuzz build --debug-assertions --codegen-units 16 "${profile_flag[@]}")
echo "==> ${build[*]}"
"${build[@]}"
if $build_only; then
	exit 0
fi
host="$(rustc +nightly -vV | sed -n 's/^host: //p')"
bin_dir="$CARGO_TARGET_DIR/$host/$profile_dir"

work="$(mktemp -d "${TMPDIR:-/tmp}/tenantry-fuzz.XXXXXX")"
failed=()
summary=()
for target in "${targets[@]}"; do
	dir="$work/$target"
	mkdir -p "$dir/corpus" "$dir/artifacts"
	if compgen -G "fuzz/corpus/$target/seed-*" >/dev/null; then
		cp fuzz/corpus/"$target"/seed-* "$dir/corpus/"
	fi
	options=(
		-max_total_time="$seconds"
		-rss_limit_mb=2048
		-timeout=30
		-print_final_stats=1
		-artifact_prefix="$dir/artifacts/"
	)
	if [[ -f "fuzz/dict/$target.dict" ]]; then
		options+=(-dict="fuzz/dict/$target.dict")
	fi
	echo "==> $target: ${seconds}s"
	started=$SECONDS
	if "$bin_dir/$target" "$dir/corpus" "${options[@]}" >"$dir/log" 2>&1; then
		status=0
	else
		status=$?
	fi
	elapsed=$((SECONDS - started))
	executions="$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/log" | tail -n 1)"
	if [[ -z "$executions" ]]; then
		executions="$(grep -o '^#[0-9]\+' "$dir/log" | tail -n 1 | tr -d '#')"
	fi
	mapfile -t crashes < <(find "$dir/artifacts" -type f | sort)
	if ((status == 0)) && ((${#crashes[@]} == 0)); then
		result=ok
	else
		result="FAILED (exit $status)"
		failed+=("$target")
		echo "--- $target: what failed ($dir/log)"
		grep -m 1 -A 12 -E 'panicked at|ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)' "$dir/log" || true
		echo "--- $target: end of the libFuzzer log"
		tail -n 25 "$dir/log"
		for crash in "${crashes[@]}"; do
			echo "--- crashing input: $crash ($(wc -c <"$crash") bytes)"
			od -A x -t x1z -v "$crash" | head -n 32
			echo "    replay:  $bin_dir/$target $crash"
			echo "    or:      PATH=\"$fuzz_root/bin:\$PATH\" cargo +nightly fuzz run --debug-assertions ${profile_flag[*]} $target $crash"
		done
	fi
	summary+=("$(printf '%-18s %5ss %12s execs  %s' "$target" "$elapsed" "${executions:-?}" "$result")")
done

echo
echo "==> fuzz summary"
printf '%s\n' "${summary[@]}"
if ((${#failed[@]})); then
	echo "crashed: ${failed[*]}; inputs and logs kept in $work" >&2
	exit 1
fi
rm -rf "$work"
