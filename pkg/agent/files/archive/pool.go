package archive

import (
	"bytes"
	"io/fs"
	"sync"
	"time"
)

// smallFile is the largest file the pool writes; larger ones are written
// by the reading goroutine straight from the stream.
const smallFile = 1 << 20

// fileJob is a small file to write.
type fileJob struct {
	name, p string
	mode    fs.FileMode
	mtime   time.Time
	data    []byte
}

// pool writes small files on a few goroutines while the archive is read.
type pool struct {
	x       *extractor
	jobs    chan fileJob
	workers sync.WaitGroup
	pending sync.WaitGroup // submitted, not yet written
	mu      sync.Mutex
	err     error // the first failure
	once    sync.Once
}

func newPool(x *extractor, n int) *pool {
	p := &pool{x: x, jobs: make(chan fileJob, 2*n)}
	for range n {
		p.workers.Add(1)
		go p.work()
	}
	return p
}

func (p *pool) work() {
	defer p.workers.Done()
	for j := range p.jobs {
		if p.failed() == nil && p.x.ctx.Err() == nil {
			if _, err := p.x.writeFile(j.name, j.p, j.mode, j.mtime, bytes.NewReader(j.data), false); err != nil {
				p.fail(err)
			}
		}
		p.pending.Done()
	}
}

func (p *pool) fail(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err == nil {
		p.err = err
	}
}

func (p *pool) failed() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// submit queues a file; it returns an earlier failure instead.
func (p *pool) submit(j fileJob) error {
	if err := p.failed(); err != nil {
		return err
	}
	p.pending.Add(1)
	p.jobs <- j
	return nil
}

// wait returns once every submitted file is written, with the first
// failure.
func (p *pool) wait() error {
	p.pending.Wait()
	return p.failed()
}

// stop ends the workers once they are done; idempotent.
func (p *pool) stop() {
	p.once.Do(func() {
		close(p.jobs)
		p.workers.Wait()
	})
}

// flush waits for the files in flight (none without a pool).
func (x *extractor) flush() error {
	if x.pool == nil {
		return nil
	}
	return x.pool.wait()
}
