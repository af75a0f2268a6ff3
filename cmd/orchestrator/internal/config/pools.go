package config

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/berth-dev/berth/pkg/orchestrator"
)

// poolsValue is the warm pools (orchestrator.Config.Pools): one pool per
// --pool flag (repeatable) as
// name=NAME,image=IMAGE,min=N,max=N[,cpus=C][,memory=SIZE][,pids=N][,disk=SIZE][,user=USER],
// several separated by ';' in BERTH_POOLS, and a list of objects under
// "pools" in the file. The environment's and the flags' pools add to the
// file's; a name may be used once (the lease manager refuses duplicates).
type poolsValue struct{ p *[]orchestrator.Pool }

// repeatable marks poolsValue's flag as one that may be given several
// times, each adding a pool (see flagValue).
func (poolsValue) repeatable() {}

// Set implements pflag.Value: it adds the pools of s (one, or several
// separated by ';').
func (v poolsValue) Set(s string) error {
	for _, one := range strings.Split(s, ";") {
		if strings.TrimSpace(one) == "" {
			continue
		}
		p, err := parsePool(one)
		if err != nil {
			return err
		}
		*v.p = append(*v.p, p)
	}
	return nil
}

// parsePool parses one pool's key=value list.
func parsePool(s string) (orchestrator.Pool, error) {
	var p orchestrator.Pool
	minSet, maxSet := false, false
	for _, kv := range strings.Split(s, ",") {
		k, val, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok || val == "" {
			return p, fmt.Errorf("pool %q: want key=value, got %q", s, kv)
		}
		var err error
		switch k {
		case "name":
			p.Name = val
		case "image":
			p.Image = val
		case "user":
			p.User = val
		case "min":
			err, minSet = intValue[int]{p: &p.Min}.Set(val), true
		case "max":
			err, maxSet = intValue[int]{p: &p.Max}.Set(val), true
		case "cpus":
			err = cpusValue{&p.CPUs}.Set(val)
		case "memory":
			err = intValue[int64]{p: &p.MemoryBytes, bytes: true}.Set(val)
		case "pids":
			err = intValue[int64]{p: &p.Pids}.Set(val)
		case "disk":
			err = intValue[int64]{p: &p.DiskBytes, bytes: true}.Set(val)
		default:
			return p, fmt.Errorf("pool %q: unknown key %q (want name, image, min, max, cpus, memory, pids, disk, user)", s, k)
		}
		if err != nil {
			return p, fmt.Errorf("pool %q: %s: %w", s, k, err)
		}
	}
	switch {
	case p.Name == "":
		return p, fmt.Errorf("pool %q: name is required", s)
	case !maxSet:
		return p, fmt.Errorf("pool %q: max is required", s)
	case !minSet:
		p.Min = p.Max
	}
	return p, nil
}

func (v poolsValue) setJSON(raw json.RawMessage) error {
	var list []orchestrator.Pool
	if err := strictJSON(raw, &list); err != nil {
		return err
	}
	*v.p = list
	return nil
}

// String lists the pools by name.
func (v poolsValue) String() string {
	names := make([]string, 0, len(*v.p))
	for _, p := range *v.p {
		names = append(names, p.Name)
	}
	return strings.Join(names, ",")
}

// Type implements pflag.Value.
func (v poolsValue) Type() string { return "pool" }
