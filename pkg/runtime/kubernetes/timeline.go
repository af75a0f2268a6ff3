package kubernetes

import (
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// timeline records when a Create saw each step of its sandbox's start, as
// offsets from the Create's beginning, and logs them at its end (debug
// level, "kubernetes: create timeline"): where the seconds of a cold start
// go (docs/kubernetes.md, Cold start). The steps observed on the Pod are
// when the informer delivered them, not when the kubelet did them.
type timeline struct {
	began time.Time
	mu    sync.Mutex
	names []string
	at    map[string]time.Duration
}

// Steps of a timeline.
const (
	stepClaimCreated  = "claim_created"
	stepClaimBound    = "claim_bound"
	stepSpareTaken    = "spare_taken"
	stepSecretCreated = "secret_created"
	stepPodCreated    = "pod_created"
	stepPodIP         = "pod_ip"
	stepInitDone      = "init_done"
	stepRunning       = "container_running"
	stepAgentReady    = "agent_ready"
)

func newTimeline() *timeline { return &timeline{began: time.Now(), at: map[string]time.Duration{}} }

// mark records step now, unless it was recorded before. A nil timeline
// records nothing.
func (t *timeline) mark(step string) {
	if t == nil {
		return
	}
	d := time.Since(t.began)
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.at[step]; !ok {
		t.names = append(t.names, step)
		t.at[step] = d
	}
}

// observe records the steps pod shows: its IP, its init container done,
// its sandbox container running.
func (t *timeline) observe(pod *corev1.Pod) {
	if t == nil {
		return
	}
	if pod.Status.PodIP != "" {
		t.mark(stepPodIP)
	}
	for _, st := range pod.Status.InitContainerStatuses {
		if st.Name == installName && st.State.Terminated != nil {
			t.mark(stepInitDone)
		}
	}
	if st := mainStatus(pod); st != nil && st.State.Running != nil {
		t.mark(stepRunning)
	}
}

// attrs returns the steps as log attributes (milliseconds), in the order
// they were reached.
func (t *timeline) attrs() []any {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]any, 0, 2*len(t.names))
	for _, n := range t.names {
		out = append(out, n+"_ms", t.at[n].Milliseconds())
	}
	return out
}
