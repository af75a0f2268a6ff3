package openhands

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/berth-dev/berth/pkg/agent/process"
)

// Limits of the in-memory bash event store and of output chunks.
const (
	// ChunkBytes is the largest output chunk of one BashOutput event.
	ChunkBytes = 256 << 10
	// FlushInterval is the longest output waits before it becomes an event.
	FlushInterval = 50 * time.Millisecond
	// MaxCommands is the number of commands whose events are kept.
	MaxCommands = 512
	// MaxCommandOutput is the output kept per command; the rest is dropped.
	MaxCommandOutput = 16 << 20
	// MaxTotalOutput is the output kept for all commands together.
	MaxTotalOutput = 128 << 20
	// killGrace is the time between SIGTERM and SIGKILL of a timed-out command.
	killGrace = time.Second
)

// Event kinds.
const (
	kindCommand = "BashCommand"
	kindOutput  = "BashOutput"
)

// event is one bash event: a BashCommand or a BashOutput. JSON field names
// are the agent-server's.
type event struct {
	seq uint64 // global order of creation; sorts by timestamp

	Kind      string `json:"kind"`
	ID        string `json:"id"`
	Timestamp string `json:"timestamp"`
	// BashCommand fields.
	Command string  `json:"command,omitempty"`
	Cwd     *string `json:"cwd,omitempty"`
	Timeout *int    `json:"timeout,omitempty"`
	// BashOutput fields.
	CommandID string  `json:"command_id,omitempty"`
	Order     *int    `json:"order,omitempty"`
	ExitCode  *int    `json:"exit_code"`
	Stdout    *string `json:"stdout"`
	Stderr    *string `json:"stderr"`

	ts time.Time
}

// MarshalJSON drops the BashOutput-only nullable fields from a BashCommand.
func (e *event) MarshalJSON() ([]byte, error) {
	type plain event
	if e.Kind == kindCommand {
		return jsonMarshal(struct {
			Kind      string  `json:"kind"`
			ID        string  `json:"id"`
			Timestamp string  `json:"timestamp"`
			Command   string  `json:"command"`
			Cwd       *string `json:"cwd"`
			Timeout   *int    `json:"timeout"`
		}{e.Kind, e.ID, e.Timestamp, e.Command, e.Cwd, e.Timeout})
	}
	return jsonMarshal((*plain)(e))
}

// command is one started command and its events.
type command struct {
	start   *event
	outputs []*event
	done    bool
	bytes   int64 // output kept
	dropped int64 // output dropped (MaxCommandOutput)
	doneCh  chan struct{}
}

// store holds the bash events of the agent.
type store struct {
	mu    sync.Mutex
	seq   uint64
	cmds  map[string]*command
	order []*command // creation order
	total int64
	now   func() time.Time
}

func newStore() *store {
	return &store{cmds: make(map[string]*command), now: time.Now}
}

// newEventID returns a random UUID (version 4) in the agent-server's JSON
// form: 32 hex digits without hyphens.
func newEventID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return hex.EncodeToString(b[:])
}

// normID accepts a UUID with or without hyphens, in any case, and returns
// its 32-hex-digit form; ok is false for anything else.
func normID(s string) (string, bool) {
	s = strings.ToLower(strings.TrimSpace(s))
	if len(s) == 36 && s[8] == '-' && s[13] == '-' && s[18] == '-' && s[23] == '-' {
		s = s[:8] + s[9:13] + s[14:18] + s[19:23] + s[24:]
	}
	s = strings.TrimPrefix(s, "urn:uuid:")
	if len(s) != 32 {
		return "", false
	}
	if _, err := hex.DecodeString(s); err != nil {
		return "", false
	}
	return s, true
}

// stamp sets e's sequence number and timestamp; s.mu is held.
func (s *store) stamp(e *event) {
	s.seq++
	e.seq = s.seq
	e.ts = s.now().UTC()
	e.Timestamp = e.ts.Format("2006-01-02T15:04:05.000000Z")
}

// add registers a new command and returns it.
func (s *store) add(cmdLine, cwd string, timeout int) *command {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := &event{Kind: kindCommand, ID: newEventID(), Command: cmdLine, Cwd: &cwd, Timeout: &timeout}
	s.stamp(e)
	c := &command{start: e, doneCh: make(chan struct{})}
	s.cmds[e.ID] = c
	s.order = append(s.order, c)
	s.evictLocked()
	return c
}

// remove forgets a command that never started.
func (s *store) remove(c *command) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.cmds, c.start.ID)
	if i := slices.Index(s.order, c); i >= 0 {
		s.order = slices.Delete(s.order, i, i+1)
	}
}

// evictLocked forgets the oldest finished commands while there are more
// than MaxCommands or more than MaxTotalOutput bytes of output.
func (s *store) evictLocked() {
	for i := 0; i < len(s.order) && (len(s.order) > MaxCommands || s.total > MaxTotalOutput); {
		c := s.order[i]
		if !c.done {
			i++
			continue
		}
		s.total -= c.bytes
		delete(s.cmds, c.start.ID)
		s.order = slices.Delete(s.order, i, i+1)
	}
}

// output appends a BashOutput event to c. Output beyond MaxCommandOutput
// (or, for a running command, beyond MaxTotalOutput) is counted as dropped.
// final events carry exit and are never dropped.
func (s *store) output(c *command, stdout, stderr string, exit *int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := int64(len(stdout) + len(stderr))
	if exit == nil && (c.bytes+n > MaxCommandOutput || s.total+n > MaxTotalOutput) {
		c.dropped += n
		return
	}
	if exit != nil && c.dropped > 0 {
		stderr += fmt.Sprintf("\n[berth: %d bytes of output were dropped: a command keeps at most %d bytes]\n", c.dropped, MaxCommandOutput)
	}
	order := len(c.outputs)
	e := &event{Kind: kindOutput, ID: newEventID(), CommandID: c.start.ID, Order: &order, ExitCode: exit}
	if stdout != "" {
		e.Stdout = &stdout
	}
	if stderr != "" {
		e.Stderr = &stderr
	}
	s.stamp(e)
	c.outputs = append(c.outputs, e)
	c.bytes += n
	s.total += n
	if exit != nil {
		c.done = true
		close(c.doneCh)
		s.evictLocked()
	}
}

// query selects events for search.
type query struct {
	kind      string // "" for both
	commandID string // "" for all
	gte, lt   time.Time
	orderGT   *int
	desc      bool
	pageSeq   uint64 // 0: from the start
	limit     int
}

// search returns the events q selects, one page of them, and the id of the
// next page ("" when there is none).
func (s *store) search(q query) ([]*event, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var cmds []*command
	if q.commandID != "" {
		if c, ok := s.cmds[q.commandID]; ok {
			cmds = []*command{c}
		}
	} else {
		cmds = s.order
	}
	evs := []*event{} // an empty page is [] in JSON, never null
	for _, c := range cmds {
		if q.kind != kindOutput && q.commandID == "" {
			// The agent-server files a BashCommand under no command id, so
			// a command_id filter selects its outputs only.
			evs = append(evs, c.start)
		}
		if q.kind != kindCommand {
			for _, o := range c.outputs {
				if q.orderGT == nil || *o.Order > *q.orderGT {
					evs = append(evs, o)
				}
			}
		}
	}
	evs = slices.DeleteFunc(evs, func(e *event) bool {
		return (q.kind != "" && e.Kind != q.kind) ||
			(!q.gte.IsZero() && e.ts.Before(q.gte)) ||
			(!q.lt.IsZero() && !e.ts.Before(q.lt))
	})
	slices.SortFunc(evs, func(a, b *event) int {
		if q.desc {
			a, b = b, a
		}
		switch {
		case a.seq < b.seq:
			return -1
		case a.seq > b.seq:
			return 1
		}
		return 0
	})
	start := 0
	if q.pageSeq != 0 {
		start = len(evs)
		for i, e := range evs {
			if e.seq == q.pageSeq {
				start = i
				break
			}
		}
	}
	evs = evs[start:]
	next := ""
	if len(evs) > q.limit {
		next = fmt.Sprint(evs[q.limit].seq)
		evs = evs[:q.limit]
	}
	return slices.Clone(evs), next
}

// get returns the event with id, or nil.
func (s *store) get(id string) *event {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.order {
		if c.start.ID == id {
			return c.start
		}
		for _, o := range c.outputs {
			if o.ID == id {
				return o
			}
		}
	}
	return nil
}

// clear forgets every finished command and returns the number of events
// forgotten.
func (s *store) clear() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	s.order = slices.DeleteFunc(s.order, func(c *command) bool {
		if !c.done {
			return false
		}
		n += 1 + len(c.outputs)
		s.total -= c.bytes
		delete(s.cmds, c.start.ID)
		return true
	})
	return n
}

// last returns c's last output event, or nil.
func (s *store) last(c *command) *event {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(c.outputs) == 0 {
		return nil
	}
	return c.outputs[len(c.outputs)-1]
}

// collector turns a running command's stream events into BashOutput
// events: it coalesces output per stream and flushes it when ChunkBytes
// are waiting or, when live, FlushInterval after the first waiting byte.
// A command that is not live (execute_bash_command, whose caller waits for
// the end) keeps its output for the last event, as the agent-server does:
// the answer is that event, so a timed flush would take output out of it.
type collector struct {
	st   *store
	c    *command
	live bool
	mu   sync.Mutex
	out  [2][]byte // stdout, stderr waiting
	tm   *time.Timer
}

func (k *collector) add(stream int, data []byte) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.out[stream] = append(k.out[stream], data...)
	if len(k.out[stream]) >= ChunkBytes {
		k.flushLocked()
		return
	}
	if k.live && k.tm == nil {
		k.tm = time.AfterFunc(FlushInterval, func() {
			k.mu.Lock()
			defer k.mu.Unlock()
			k.tm = nil
			k.flushLocked()
		})
	}
}

// flushLocked emits the waiting output as events, keeping only an
// incomplete trailing UTF-8 sequence for later.
func (k *collector) flushLocked() {
	for i := range k.out {
		k.drainLocked(i, len(k.out[i])-completeUTF8(k.out[i]))
	}
}

// drainLocked emits stream i's waiting output as events of at most
// ChunkBytes, ending on character boundaries, until at most keep bytes wait.
func (k *collector) drainLocked(i, keep int) {
	b := k.out[i]
	for len(b) > keep {
		n := min(len(b)-keep, ChunkBytes)
		if m := completeUTF8(b[:n]); m > 0 {
			n = m
		}
		text := strings.ToValidUTF8(string(b[:n]), "\uFFFD")
		if i == 0 {
			k.st.output(k.c, text, "", nil)
		} else {
			k.st.output(k.c, "", text, nil)
		}
		b = b[n:]
	}
	k.out[i] = append(k.out[i][:0], b...)
}

// finish emits the last event: the output still waiting (whole chunks
// first, so that the last event stays small) and the exit code.
func (k *collector) finish(exit int, note string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.tm != nil {
		k.tm.Stop()
		k.tm = nil
	}
	k.drainLocked(0, ChunkBytes)
	k.drainLocked(1, ChunkBytes)
	stdout := strings.ToValidUTF8(string(k.out[0]), "\uFFFD")
	stderr := strings.ToValidUTF8(string(k.out[1]), "\uFFFD") + note
	k.out = [2][]byte{}
	k.st.output(k.c, stdout, stderr, &exit)
}

// completeUTF8 returns the length of b without a trailing incomplete UTF-8
// sequence (at most 3 bytes are held back).
func completeUTF8(b []byte) int {
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) {
				return i
			}
			return len(b)
		}
	}
	return len(b)
}

// exitCode is the agent-server's exit code for st: -1 after a timeout,
// -N for a command whose shell was ended by signal N (Python's returncode,
// which the agent-server reports), else its status.
func exitCode(st process.ExitStatus) int {
	switch {
	case st.TimedOut:
		return -1
	case st.Signal != "":
		// As the agent-server (Python's returncode): minus the signal.
		if sig, err := process.ParseSignal(st.Signal); err == nil {
			return -int(sig)
		}
		return -1
	}
	return st.ExitCode
}

// run starts cmdLine and returns once it started (or could not); its
// output then flows into the store until it ends, in events flushed every
// FlushInterval when live. ctx bounds the command's life (the handler's
// lifetime), not the start.
func (h *Handler) run(ctx context.Context, cmdLine, cwd string, timeout int, live bool) (*command, error) {
	c := h.store.add(cmdLine, cwd, timeout)
	k := &collector{st: h.store, c: c, live: live}
	started := make(chan error, 1)
	go func() {
		res, err := h.runner.Stream(ctx, process.Spec{
			Command: cmdLine, Cwd: cwd,
			Timeout: time.Duration(timeout) * time.Second, KillGrace: killGrace,
			// As the agent-server: `nohup server &` outlives its command.
			KeepGroup: true,
		}, func(ev process.Event) error {
			switch ev.Kind {
			case process.EventStarted:
				started <- nil
			case process.EventStdout:
				k.add(0, ev.Data)
			case process.EventStderr:
				k.add(1, ev.Data)
			}
			return nil
		})
		if res.Pid == 0 && err != nil {
			started <- err // never started
			return
		}
		note := ""
		switch {
		case res.TimedOut:
			note = fmt.Sprintf("\nCommand timed out after %d seconds\n", timeout)
		case err != nil && errors.Is(err, context.Canceled):
			note = "\nCommand stopped: the agent is shutting down\n"
		}
		k.finish(exitCode(res.ExitStatus), note)
	}()
	if err := <-started; err != nil {
		h.store.remove(c)
		return nil, err
	}
	return c, nil
}
