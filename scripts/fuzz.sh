#!/usr/bin/env bash
# Runs the property tests of hostile input for a set time: each target
# again and again, with many cases (PROPTEST_CASES) and a fresh seed
# (PROPTEST_RNG_SEED) each round, then prints per target the rounds, the
# cases tried and the failures. Exits non-zero when any round failed or a
# target ran no test; each failing round's log (with its seed and minimal
# input) is kept.
#
#   scripts/fuzz.sh [MINUTES] [TARGET...]
#
# MINUTES defaults to 5; TARGET is any of agent, tools, config, http
# (default all); http is the HTTP API's request bodies, against a server
# in the test process. FUZZ_CASES sets the cases per property and round
# (default 1000; the properties whose cases take megabytes run a fraction
# of them).
# FUZZ_LOGS names the folder for the logs (default a new temporary one).
set -uo pipefail
cd "$(dirname "$0")/.."

minutes="${1:-5}"
shift || true
case "$minutes" in
    '' | *[!0-9]*)
        echo "usage: scripts/fuzz.sh [MINUTES] [agent|tools|config|http ...]" >&2
        exit 2
        ;;
esac
cases="${FUZZ_CASES:-1000}"
logs="${FUZZ_LOGS:-$(mktemp -d "${TMPDIR:-/tmp}/wma-fuzz.XXXXXX")}"
mkdir -p "$logs"

# target name, then the cargo arguments that build and run it, then the
# test filter (the agent's properties are a module of its unit tests, since
# they check limits the crate keeps to itself; the tools, config and http
# properties are modules of the crates' one test binary; the http ones are
# a module inside the config ones, which skip them).
declare -A args=(
    [agent]="-p wma-agent --lib"
    [tools]="-p wma-tools --test tests"
    [config]="-p webmcp-agents --test tests"
    [http]="-p webmcp-agents --test tests"
)
declare -A filter=(
    [agent]="properties::"
    [tools]="cdp_properties::"
    [config]="properties:: --skip properties::http_bodies::"
    [http]="properties::http_bodies::"
)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(agent tools config http)
for target in "${targets[@]}"; do
    if [ -z "${args[$target]+set}" ]; then
        echo "unknown target $target (agent, tools, config or http)" >&2
        exit 2
    fi
done

# Build once up front, so the clock measures testing.
for target in "${targets[@]}"; do
    # shellcheck disable=SC2086
    if ! cargo test ${args[$target]} --no-run -q; then
        echo "fuzz: $target does not build" >&2
        exit 1
    fi
done

declare -A rounds=() tests=() failures=()
for target in "${targets[@]}"; do
    rounds[$target]=0
    tests[$target]=0
    failures[$target]=0
done

deadline=$(($(date +%s) + minutes * 60))
echo "fuzz: ${targets[*]} for $minutes min, $cases cases per property and round; logs in $logs"
while [ "$(date +%s)" -lt "$deadline" ]; do
    for target in "${targets[@]}"; do
        [ "$(date +%s)" -lt "$deadline" ] || break
        round=$((rounds[$target] + 1))
        seed=$(od -An -N8 -tu8 /dev/urandom | tr -d ' ')
        log="$logs/$target-$round.log"
        # shellcheck disable=SC2086
        PROPTEST_CASES="$cases" PROPTEST_RNG_SEED="$seed" \
            cargo test -q ${args[$target]} -- ${filter[$target]} >"$log" 2>&1
        status=$?
        passed=$(grep -Eo '[0-9]+ passed' "$log" | awk '{n += $1} END {print n + 0}')
        failed=$(grep -Eo '[0-9]+ failed' "$log" | awk '{n += $1} END {print n + 0}')
        rounds[$target]=$round
        tests[$target]=$((tests[$target] + passed + failed))
        if [ "$status" -ne 0 ] || [ $((passed + failed)) -eq 0 ]; then
            failures[$target]=$((failures[$target] + 1))
            if [ $((passed + failed)) -eq 0 ] && [ "$status" -eq 0 ]; then
                echo "fuzz: $target round $round ran no test (is its module in the test binary?)"
            else
                echo "fuzz: $target round $round FAILED (seed $seed), log $log"
                grep -E -A12 '^Test failed|minimal failing input' "$log" | head -40
            fi
        else
            rm -f "$log"
        fi
    done
done

status=0
printf '\n%-8s %7s %12s %10s %9s\n' target rounds properties cases failures
for target in "${targets[@]}"; do
    r=${rounds[$target]}
    per_round=0
    [ "$r" -gt 0 ] && per_round=$((tests[$target] / r))
    # Nominal: cases per property and round, times properties, times
    # rounds; the megabyte properties run a fraction of it.
    printf '%-8s %7d %12d %10d %9d\n' "$target" "$r" "$per_round" \
        $((tests[$target] * cases)) "${failures[$target]}"
    [ "${failures[$target]}" -eq 0 ] && [ "$r" -gt 0 ] || status=1
done
exit "$status"
