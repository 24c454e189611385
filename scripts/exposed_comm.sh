# Reading a run's timer report for the overlap benchmarks (bench_moe_overlap.sh,
# bench_sharded_overlap.sh); sourced, not run.

# last_max <log> <timer>: the timer's max over ranks (ms per iteration) in the last report.
last_max() { grep -E "^ *$2 " "$1" | tail -1 | sed -n 's/.*, \([0-9.]*\))$/\1/p'; }

# iteration_ms <log>: the elapsed time per iteration of the last logged interval.
iteration_ms() { grep "] iteration " "$1" | tail -1 | sed -n 's/.*elapsed time per iteration (ms): \([0-9.]*\).*/\1/p'; }

# hidden_share <exposed without> <ms/iter without> <exposed with>: the share of the exposed time
# the overlap hid of what the computation could cover, (exposed without - exposed with) /
# min(exposed without, compute), compute being the iteration's time minus the exposed time in the
# run without.
hidden_share() {
  awk -v e0="$1" -v t0="$2" -v e1="$3" \
    'BEGIN { c = t0 - e0; m = (e0 < c ? e0 : c); if (m > 0) printf "%.0f%% (%.1f of %.1f ms)", 100 * (e0 - e1) / m, e0 - e1, m }'
}
