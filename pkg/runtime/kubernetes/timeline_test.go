package kubernetes_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/berth-dev/berth/internal/testsupport/k8sclaim"
	"github.com/berth-dev/berth/pkg/runtime"
	k8s "github.com/berth-dev/berth/pkg/runtime/kubernetes"
)

// timelines is a slog.Handler keeping the steps of the "kubernetes:
// create timeline" records (milliseconds by step).
type timelines struct {
	mu    sync.Mutex
	order []string
	steps map[string][]time.Duration
}

func (h *timelines) Enabled(context.Context, slog.Level) bool { return true }
func (h *timelines) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *timelines) WithGroup(string) slog.Handler            { return h }
func (h *timelines) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "kubernetes: create timeline" {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	r.Attrs(func(a slog.Attr) bool {
		if a.Value.Kind() == slog.KindInt64 {
			if !slices.Contains(h.order, a.Key) {
				h.order = append(h.order, a.Key)
			}
			h.steps[a.Key] = append(h.steps[a.Key], time.Duration(a.Value.Int64())*time.Millisecond)
		}
		return true
	})
	return nil
}

// TestCreateTimeline (BERTH_BENCH=1) creates sandboxes of berth/minimal
// one after the other and prints, for each step of a cold start, when
// Create saw it (p50 and max of the offsets from Create's beginning):
// where the seconds go (docs/kubernetes.md, Cold start); then the same
// with the test cluster's StorageClass named (Create waits for the claim's
// binding), with spare claims of that class (Create takes one), on a
// persistent workspace, whose claim exists after the first, and with the
// agent from a claim.
func TestCreateTimeline(t *testing.T) {
	if os.Getenv("BERTH_BENCH") == "" {
		t.Skip("a figure for docs/kubernetes.md (BERTH_BENCH=1)")
	}
	_, dir := needCluster(t)
	loadImage(t, "berth/minimal:latest")
	h := &timelines{steps: map[string][]time.Duration{}}
	rt, err := k8s.New(context.Background(), k8s.Config{
		Kubeconfig: filepath.Join(dir, "berth.kubeconfig"), NodeName: nodeName,
		AgentImagePullPolicy: corev1.PullNever, ImagePullPolicy: corev1.PullNever,
		Logger: slog.New(h),
	})
	if err != nil {
		t.Fatal(err)
	}
	first := rt // run uses rt, which the last run replaces
	t.Cleanup(func() { first.Close() })
	p := func(ds []time.Duration, q float64) time.Duration {
		s := slices.Clone(ds)
		slices.Sort(s)
		return s[int(q*float64(len(s)-1)+0.5)]
	}
	// run creates and removes n sandboxes of spec (a fresh lease id
	// each) on rt and prints the steps under title; before, when given,
	// runs before each Create.
	run := func(rt *k8s.Runtime, title string, n int, spec runtime.Spec, before func()) {
		h.mu.Lock()
		h.order, h.steps = nil, map[string][]time.Duration{}
		h.mu.Unlock()
		var total []time.Duration
		for i := range n {
			spec.LeaseID = fmt.Sprintf("timeline-%d-%d", time.Now().UnixNano()%1e6, i)
			if before != nil {
				before()
			}
			began := time.Now()
			sb, err := rt.Create(context.Background(), spec)
			if err != nil {
				t.Fatal(err)
			}
			total = append(total, time.Since(began))
			if err := rt.Remove(context.Background(), sb.ID); err != nil {
				t.Fatal(err)
			}
		}
		for _, step := range h.order {
			ds := h.steps[step]
			fmt.Printf("%s %-22s p50 %6dms max %6dms (n=%d)\n", title, step, p(ds, 0.5).Milliseconds(), p(ds, 1).Milliseconds(), len(ds))
		}
		fmt.Printf("%s %-22s p50 %6dms max %6dms (n=%d)\n", title, "Create", p(total, 0.5).Milliseconds(), p(total, 1).Milliseconds(), len(total))
	}
	spec := runtime.Spec{Image: "berth/minimal:latest", AgentToken: "tok-timeline", InstanceID: "timeline-test", ReadyTimeout: time.Minute}
	run(rt, "K8S-TIMELINE", 7, spec, nil)

	// The test cluster's class named (Immediate: Create waits for the
	// claim's binding), then the same with spare claims taken instead.
	cs, _ := needCluster(t)
	const class = "berth-local"
	classed, err := k8s.New(context.Background(), k8s.Config{
		Kubeconfig: filepath.Join(dir, "berth.kubeconfig"), NodeName: nodeName, StorageClass: class,
		AgentImagePullPolicy: corev1.PullNever, ImagePullPolicy: corev1.PullNever,
		Logger: slog.New(h),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { classed.Close() })
	run(classed, "K8S-TIMELINE-CLASS", 7, spec, nil)
	f := newSpareFleet(t, cs, dir, 2, class, slog.New(h))
	run(f.rt, "K8S-TIMELINE-SPARE", 7, spec, func() { f.waitSpares(t, 2) })

	// On a persistent workspace: its claim made by the first Create,
	// mounted again (bound) by the others.
	vol := fmt.Sprintf("berth-ws-timeline-%d", time.Now().UnixNano()%1e6)
	t.Cleanup(func() {
		if err := rt.RemoveVolume(context.Background(), vol); err != nil {
			t.Errorf("cleanup: remove volume %s: %v", vol, err)
		}
	})
	spec.Mounts = []runtime.Mount{{Type: runtime.MountVolume, Source: vol, Target: runtime.DefaultWorkDir,
		VolumeLabels: runtime.VolumeLabels("timeline-owner", "timeline-conversation")}}
	run(rt, "K8S-TIMELINE-FIRST-PERSIST", 1, spec, nil)
	run(rt, "K8S-TIMELINE-PERSISTED", 5, spec, nil)

	// The agent mounted from a claim (Config.AgentClaim): no init
	// container. The same Creates as the first run, by a runtime of its own.
	claim := k8sclaim.Agent(t, cs, rt.Namespace())
	rt, err = k8s.New(context.Background(), k8s.Config{
		Kubeconfig: filepath.Join(dir, "berth.kubeconfig"), NodeName: nodeName, AgentClaim: claim,
		AgentImagePullPolicy: corev1.PullNever, ImagePullPolicy: corev1.PullNever,
		Logger: slog.New(h),
	})
	if err != nil {
		t.Fatal(err)
	}
	withClaim := rt
	t.Cleanup(func() { withClaim.Close() })
	spec.Mounts = nil
	run(rt, "K8S-TIMELINE-AGENT-CLAIM", 7, spec, nil)
}
