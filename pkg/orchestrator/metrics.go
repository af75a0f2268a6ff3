package orchestrator

import (
	"fmt"
	"net/http"
	"sort"

	"github.com/berth-dev/berth/pkg/lease"
	"github.com/berth-dev/berth/pkg/proxy"
)

// metricsHandler serves the lease manager's counters in the Prometheus text
// exposition format. It is open (no token) like /healthz: it reveals counts
// only, and the listener is loopback by default.
func metricsHandler(m *lease.Manager, px *proxy.Proxy) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		st := m.Stats()
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprintln(w, "# HELP berth_leases Leases by state (ended leases until purged).")
		fmt.Fprintln(w, "# TYPE berth_leases gauge")
		for _, s := range lease.States {
			if s == lease.StateUnspecified {
				continue
			}
			fmt.Fprintf(w, "berth_leases{state=%q} %d\n", s.String(), st.ByState[s])
		}
		fmt.Fprintln(w, "# HELP berth_leases_live Live leases (PENDING, READY, RELEASING).")
		fmt.Fprintln(w, "# TYPE berth_leases_live gauge")
		fmt.Fprintf(w, "berth_leases_live %d\n", st.Live)
		fmt.Fprintln(w, "# HELP berth_leases_max Maximum live leases.")
		fmt.Fprintln(w, "# TYPE berth_leases_max gauge")
		fmt.Fprintf(w, "berth_leases_max %d\n", st.MaxLive)
		fmt.Fprintln(w, "# HELP berth_leases_created_total Leases created since start.")
		fmt.Fprintln(w, "# TYPE berth_leases_created_total counter")
		fmt.Fprintf(w, "berth_leases_created_total %d\n", st.Created)
		fmt.Fprintln(w, "# HELP berth_lease_transitions_total Transitions into each state since start.")
		fmt.Fprintln(w, "# TYPE berth_lease_transitions_total counter")
		keys := make([]string, 0, len(st.Transitions))
		for s := range st.Transitions {
			keys = append(keys, string(s))
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(w, "berth_lease_transitions_total{to=%q} %d\n", lease.State(k).String(), st.Transitions[lease.State(k)])
		}
		fmt.Fprintln(w, "# HELP berth_sandboxes_uncleaned Ended leases whose container removal has not succeeded yet.")
		fmt.Fprintln(w, "# TYPE berth_sandboxes_uncleaned gauge")
		fmt.Fprintf(w, "berth_sandboxes_uncleaned %d\n", st.Uncleaned)
		ds := m.DiskStats()
		fmt.Fprintln(w, "# HELP berth_disk_limited_leases READY leases with a disk limit (resources.diskBytes).")
		fmt.Fprintln(w, "# TYPE berth_disk_limited_leases gauge")
		fmt.Fprintf(w, "berth_disk_limited_leases %d\n", ds.Limited)
		fmt.Fprintln(w, "# HELP berth_disk_used_bytes Last measured disk usage summed over READY leases with a disk limit.")
		fmt.Fprintln(w, "# TYPE berth_disk_used_bytes gauge")
		fmt.Fprintf(w, "berth_disk_used_bytes %d\n", ds.UsedBytes)
		fmt.Fprintln(w, "# HELP berth_disk_over_limit_leases READY leases over their disk limit (warned; stopped after the grace period).")
		fmt.Fprintln(w, "# TYPE berth_disk_over_limit_leases gauge")
		fmt.Fprintf(w, "berth_disk_over_limit_leases %d\n", ds.Over)
		fmt.Fprintln(w, "# HELP berth_disk_kept_sandboxes Stopped sandboxes kept after their lease failed past the disk limit.")
		fmt.Fprintln(w, "# TYPE berth_disk_kept_sandboxes gauge")
		fmt.Fprintf(w, "berth_disk_kept_sandboxes %d\n", ds.Kept)
		fmt.Fprintln(w, "# HELP berth_disk_measurements_total Disk usage measurements since start.")
		fmt.Fprintln(w, "# TYPE berth_disk_measurements_total counter")
		fmt.Fprintf(w, "berth_disk_measurements_total %d\n", ds.Measurements)
		fmt.Fprintln(w, "# HELP berth_disk_limit_stops_total Sandboxes stopped past their disk limit since start.")
		fmt.Fprintln(w, "# TYPE berth_disk_limit_stops_total counter")
		fmt.Fprintf(w, "berth_disk_limit_stops_total %d\n", ds.Stops)
		fmt.Fprintln(w, "# HELP berth_sandbox_oom_events_total Processes in sandboxes killed by the OOM killer (the engine's oom events) since start; leases are not affected.")
		fmt.Fprintln(w, "# TYPE berth_sandbox_oom_events_total counter")
		fmt.Fprintf(w, "berth_sandbox_oom_events_total %d\n", st.OOMEvents)
		fmt.Fprintln(w, "# HELP berth_sandbox_restarts_total In-place restarts of sandboxes whose container exited, since start.")
		fmt.Fprintln(w, "# TYPE berth_sandbox_restarts_total counter")
		fmt.Fprintf(w, "berth_sandbox_restarts_total %d\n", st.Restarts)
		fmt.Fprintln(w, "# HELP berth_sandbox_restart_failures_total In-place restarts that failed (their lease failed) since start.")
		fmt.Fprintln(w, "# TYPE berth_sandbox_restart_failures_total counter")
		fmt.Fprintf(w, "berth_sandbox_restart_failures_total %d\n", st.RestartFailures)
		if px != nil {
			_ = px.WriteMetrics(w)
		}
	})
}
