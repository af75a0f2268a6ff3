package orchestrator

import (
	"context"
	"testing"

	"k8s.io/client-go/rest"
)

// fakeCluster is a Cluster that elects this replica at once and shares a
// fixed secret (as kubernetes.Runtime would).
type fakeCluster struct {
	identity string
	secret   []byte
}

func (c *fakeCluster) RESTConfig() *rest.Config { return &rest.Config{} }
func (c *fakeCluster) Namespace() string        { return "berth" }
func (c *fakeCluster) SharedSecret(context.Context, int) ([]byte, error) {
	return c.secret, nil
}
func (c *fakeCluster) RunLeader(ctx context.Context, identity string, lead func(context.Context)) error {
	c.identity = identity
	lead(ctx)
	return nil
}

// The lease manager's reaper is elected only on a cluster; the replica
// takes part under its instance id.
func TestElectorOf(t *testing.T) {
	if electorOf(nil, "i") != nil {
		t.Fatal("no cluster, yet an elector")
	}
	c := &fakeCluster{}
	elect := electorOf(c, "instance-1")
	if elect == nil {
		t.Fatal("no elector on a cluster")
	}
	led := false
	if err := elect(context.Background(), func(context.Context) { led = true }); err != nil || !led || c.identity != "instance-1" {
		t.Fatalf("elect: err %v, led %v, identity %q", err, led, c.identity)
	}
}

// The token secret comes from the cluster, else from the data directory.
func TestLoadSecret(t *testing.T) {
	shared := []byte("0123456789abcdef0123456789abcdef")
	got, err := loadSecret(context.Background(), Config{DataDir: t.TempDir()}, &fakeCluster{secret: shared})
	if err != nil || string(got) != string(shared) {
		t.Fatalf("shared: %q, %v", got, err)
	}
	got, err = loadSecret(context.Background(), Config{DataDir: t.TempDir()}, nil)
	if err != nil || len(got) < 16 || string(got) == string(shared) {
		t.Fatalf("file: %d bytes, %v", len(got), err)
	}
}

// A store that needs the cluster is refused without one.
func TestOpenStoreNeedsCluster(t *testing.T) {
	if _, err := openStore(context.Background(), Config{DataDir: t.TempDir(), LeaseStore: "kubernetes"}, nil, "i", nil); err == nil {
		t.Fatal("a kubernetes lease store opened without a cluster")
	}
}
