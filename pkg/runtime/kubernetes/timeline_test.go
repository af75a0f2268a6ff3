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
// where the seconds go (docs/kubernetes.md, Cold start).
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
	t.Cleanup(func() { rt.Close() })
	const n = 7
	var total []time.Duration
	for i := range n {
		spec := runtime.Spec{LeaseID: fmt.Sprintf("timeline-%d-%d", time.Now().UnixNano()%1e6, i), Image: "berth/minimal:latest",
			AgentToken: "tok-timeline", InstanceID: "timeline-test", ReadyTimeout: time.Minute}
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
	p := func(ds []time.Duration, q float64) time.Duration {
		s := slices.Clone(ds)
		slices.Sort(s)
		return s[int(q*float64(len(s)-1)+0.5)]
	}
	for _, step := range h.order {
		ds := h.steps[step]
		fmt.Printf("K8S-TIMELINE %-22s p50 %6dms max %6dms (n=%d)\n", step, p(ds, 0.5).Milliseconds(), p(ds, 1).Milliseconds(), len(ds))
	}
	fmt.Printf("K8S-TIMELINE %-22s p50 %6dms max %6dms (n=%d)\n", "Create", p(total, 0.5).Milliseconds(), p(total, 1).Milliseconds(), len(total))
}
