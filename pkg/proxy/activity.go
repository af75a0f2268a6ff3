package proxy

import (
	"sync"
	"time"
)

// track touches lease id now and then every Config.TouchInterval until the
// returned stop is called (which touches it once more: the idle clock
// starts when the request ends). No goroutine runs between ticks.
func (p *Proxy) track(id string) (stop func()) {
	p.leases.Touch(id)
	k := &keeper{p: p, id: id}
	k.mu.Lock()
	k.t = time.AfterFunc(p.cfg.TouchInterval, k.tick)
	k.mu.Unlock()
	return k.stop
}

type keeper struct {
	p       *Proxy
	id      string
	mu      sync.Mutex
	t       *time.Timer
	stopped bool
}

func (k *keeper) tick() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.stopped {
		return
	}
	k.p.leases.Touch(k.id)
	k.t.Reset(k.p.cfg.TouchInterval)
}

func (k *keeper) stop() {
	k.mu.Lock()
	k.stopped = true
	k.t.Stop()
	k.mu.Unlock()
	k.p.leases.Touch(k.id)
}
