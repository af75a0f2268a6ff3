package config

import (
	"reflect"
	"strings"
	"testing"

	"github.com/berth-dev/berth/pkg/orchestrator"
)

func TestPools(t *testing.T) {
	file := `{"pools": [{"name": "f", "image": "berth/minimal", "min": 1, "max": 2, "memoryBytes": 268435456}]}`
	env := map[string]string{"BERTH_POOLS": "name=e1,max=1;name=e2,min=0,max=3,user=root"}
	cfg, err := load(t, file, env, "--pool", "name=py,image=berth/base,min=2,max=4,cpus=500m,memory=1Gi,pids=128,disk=2Gi",
		"--pool=name=js,max=2", "--max-pooled", "9")
	if err != nil {
		t.Fatal(err)
	}
	want := []orchestrator.Pool{
		{Name: "f", Image: "berth/minimal", Min: 1, Max: 2, MemoryBytes: 256 << 20},
		{Name: "e1", Min: 1, Max: 1},
		{Name: "e2", Min: 0, Max: 3, User: "root"},
		{Name: "py", Image: "berth/base", Min: 2, Max: 4, CPUs: 0.5, MemoryBytes: 1 << 30, Pids: 128, DiskBytes: 2 << 30},
		{Name: "js", Min: 2, Max: 2},
	}
	if !reflect.DeepEqual(cfg.Pools, want) || cfg.MaxPooled != 9 {
		t.Fatalf("pools %+v max pooled %d\nwant %+v", cfg.Pools, cfg.MaxPooled, want)
	}
	for _, bad := range []string{"name=a", "max=1", "name=a,max=x", "name=a,max=1,colour=red", "name=a,max"} {
		if _, err := load(t, "", nil, "--pool", bad); err == nil || !strings.Contains(err.Error(), "--pool") {
			t.Errorf("--pool %s: %v, want an error naming the flag", bad, err)
		}
	}
}
