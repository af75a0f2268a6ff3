package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
)

// shellOptions are shell's flags.
type shellOptions struct {
	sandboxFlags
	processFlags
	attach     string
	noReplay   bool
	list       bool
	kill       string
	signal     string
	detachKeys string
}

// defaultDetachKeys is docker's detach sequence.
const defaultDetachKeys = "ctrl-p,ctrl-q"

// newShellCommand is `orchestrator shell`.
func newShellCommand(env Env) *cobra.Command {
	o := &shellOptions{}
	cmd := &cobra.Command{
		Use:   "shell [flags] LEASE [-- CMD [ARGS...]]",
		Short: "Open an interactive terminal in a lease's sandbox",
		Long: `Open a terminal session in a lease's sandbox and connect this terminal to it:
the user's login shell, or CMD. The local terminal is put in raw mode, so
every key (Ctrl-C, Ctrl-Z, Ctrl-D, arrows) goes to the program in the
sandbox; its size follows this window's. The shell exits with the program's
exit code (128+N when signal N ended it), 0 when it detached, and like exec
when it could not run the program: 127 not found, 126 not executable, 125
any other failure of its own (unknown lease or session, refused token).

The session belongs to the sandbox, not to this command: its id is printed
on stderr first, and if this command goes away (the window closes, the
detach keys ctrl-p ctrl-q are typed, the network drops) the program keeps
running; --attach ID reconnects and replays the recent output first.

When stdin is not a terminal it is sent as typed input, unchanged; its end
stops the input only (the program still runs until it exits).

The token is the lease's (BERTH_TOKEN) or the operator's.`,
		Example: `  orchestrator shell LEASE
  orchestrator shell LEASE -- python3
  orchestrator shell -w /workspace/repo -e EDITOR=vi LEASE -- bash -l
  orchestrator shell --sh LEASE -- 'top -d 1'
  orchestrator shell --attach t-3f9a0c1d2e4b5a69 LEASE
  orchestrator shell --list LEASE
  orchestrator shell --kill t-3f9a0c1d2e4b5a69 LEASE`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			lease, argv, err := o.args(cmd, args)
			if err != nil {
				return err
			}
			switch {
			case o.list:
				return o.runList(cmd.Context(), env, lease)
			case o.kill != "":
				return o.runKill(cmd.Context(), env, lease)
			}
			return execFailure(o.run(cmd.Context(), env, lease, argv))
		},
	}
	o.sandboxFlags.register(cmd.Flags(), env, false)
	fs := cmd.Flags()
	o.processFlags.register(fs, "session")
	fs.StringVar(&o.attach, "attach", "", "re-attach to session `ID` instead of opening one")
	fs.BoolVar(&o.noReplay, "no-replay", false, "with --attach: skip the recent output, show only what comes next")
	fs.BoolVar(&o.list, "list", false, "list the sandbox's terminal sessions (-o json|yaml too)")
	fs.StringVar(&o.kill, "kill", "", "end session `ID` (SIGHUP, then SIGKILL after 2s)")
	fs.StringVar(&o.signal, "signal", "", "with --kill: only send this signal (INT, TERM, 9...)")
	fs.StringVar(&o.detachKeys, "detach-keys", defaultDetachKeys, `keys that detach, leaving the session running (e.g. "ctrl-a,d"; "" for none)`)
	return cmd
}

// args checks the command line: "LEASE", or "LEASE -- CMD ARGS..." when a
// session is opened.
func (o *shellOptions) args(cmd *cobra.Command, args []string) (lease string, argv []string, err error) {
	pos := args
	if dash := cmd.ArgsLenAtDash(); dash >= 0 {
		pos, argv = args[:dash], args[dash:]
	}
	if len(pos) != 1 {
		return "", nil, usagef("want LEASE [-- CMD [ARGS...]], got %d arguments before --", len(pos))
	}
	modes := 0
	for _, set := range []bool{o.list, o.kill != "", o.attach != ""} {
		if set {
			modes++
		}
	}
	switch {
	case modes > 1:
		return "", nil, usagef("--list, --kill and --attach exclude each other")
	case modes == 1 && len(argv) > 0:
		return "", nil, usagef("a command (after --) only goes with a new session, not with --list, --kill or --attach")
	case o.shell && len(argv) == 0:
		return "", nil, usagef("--sh needs a command line after --")
	case o.signal != "" && o.kill == "":
		return "", nil, usagef("--signal only goes with --kill")
	case o.noReplay && o.attach == "":
		return "", nil, usagef("--no-replay only goes with --attach")
	}
	if err := checkOutput(o.output); err != nil {
		return "", nil, err
	}
	if _, err := parseDetachKeys(o.detachKeys); err != nil {
		return "", nil, usageError{err.Error()}
	}
	return pos[0], argv, nil
}

// firstMessage is the message that opens (or attaches to) the session, of
// size rows × cols (0 for the agent's default), with the variables vars.
func (o *shellOptions) firstMessage(env Env, argv []string, vars map[string]string, rows, cols uint32) *agentv1.TerminalClientMessage {
	if o.attach != "" {
		return &agentv1.TerminalClientMessage{Msg: &agentv1.TerminalClientMessage_Attach{
			Attach: &agentv1.TerminalAttach{SessionId: o.attach, NoReplay: o.noReplay}}}
	}
	open := &agentv1.TerminalOpen{Cwd: o.cwd, User: o.user, Env: vars, Rows: rows, Cols: cols, Term: env.getenv("TERM")}
	if o.shell {
		open.Command = strings.Join(argv, " ")
	} else {
		open.Argv = argv
	}
	return &agentv1.TerminalClientMessage{Msg: &agentv1.TerminalClientMessage_Open{Open: open}}
}

// run connects this terminal to a session until its program exits (the
// program's exit status is returned as an ExitError) or the user detaches.
func (o *shellOptions) run(ctx context.Context, env Env, lease string, argv []string) error {
	// -e and --env-file as exec reads them.
	vars, err := o.environment(env)
	if err != nil {
		return err
	}
	sc, err := o.open(ctx, lease)
	if err != nil {
		return err
	}
	defer sc.conn.Close()
	lt := localTerminal(env)
	keys, _ := parseDetachKeys(o.detachKeys) // checked in args
	if !lt.interactive() {
		keys = nil // piped input is data, never a detach
	}
	callCtx, cancel := context.WithCancel(sc.ctx)
	defer cancel()
	stream, err := agentv1.NewTerminalServiceClient(sc.conn).Connect(callCtx)
	if err != nil {
		return fail(err)
	}
	rows, cols, _ := lt.size()
	if err := stream.Send(o.firstMessage(env, argv, vars, rows, cols)); err != nil {
		return fail(recvErr(stream, err))
	}
	first, err := stream.Recv()
	if err != nil {
		return fail(err)
	}
	info := first.GetSession()
	if info == nil {
		return fail(errors.New("the terminal stream did not start with its session"))
	}
	id := safe(info.GetId())
	fmt.Fprintf(env.Stderr, "orchestrator: session %s (re-attach with --attach %s%s)\n", id, id, detachHint(keys))

	s := &termSender{stream: stream}
	detached := make(chan struct{})
	var detachOnce sync.Once
	detach := func() {
		detachOnce.Do(func() { close(detached) })
		cancel()
	}
	// Signals are caught before the terminal goes raw, so that SIGTERM or
	// SIGHUP never leaves it raw.
	stopSignals := forwardSignals(callCtx, s, lt, detach)
	defer stopSignals()
	restore, err := lt.makeRaw()
	if err != nil {
		return fail(fmt.Errorf("raw mode on the local terminal: %w", err))
	}
	defer restore()
	if lt.interactive() {
		s.resize(lt) // the session may have another size (--attach)
	}
	go pumpInput(env.Stdin, s, keys, detach)

	exit, err := copyOutput(stream, env.Stdout)
	restore()
	select {
	case <-detached:
		fmt.Fprintf(env.Stderr, "\r\norchestrator: detached from session %s (re-attach with --attach %s)\n", id, id)
		return nil
	default:
	}
	if err != nil {
		if status.Code(err) == codes.Unavailable {
			return fail(fmt.Errorf("connection to session %s lost: %w; it keeps running: re-attach with --attach %s", id, err, id))
		}
		return fail(err)
	}
	if exit == nil {
		return fail(fmt.Errorf("session %s: %w", id, errNoExit))
	}
	if code := terminalExitStatus(exit); code != 0 {
		return ExitError(code)
	}
	return nil
}

// detachHint names the detach keys for the session line.
func detachHint(keys []byte) string {
	if len(keys) == 0 {
		return ""
	}
	return "; detach with " + describeKeys(keys)
}

// recvErr returns the stream's real error when a Send failed with io.EOF
// (the server ended the call, e.g. refused the session).
func recvErr(stream agentv1.TerminalService_ConnectClient, err error) error {
	if !errors.Is(err, io.EOF) {
		return err
	}
	if _, rerr := stream.Recv(); rerr != nil && !errors.Is(rerr, io.EOF) {
		return rerr
	}
	return err
}

// copyOutput writes the session's output to w until the stream ends; it
// returns the exit message, if one came.
func copyOutput(stream agentv1.TerminalService_ConnectClient, w io.Writer) (*agentv1.TerminalExit, error) {
	var exit *agentv1.TerminalExit
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return exit, nil
		}
		if err != nil {
			return exit, err
		}
		switch m := msg.GetMsg().(type) {
		case *agentv1.TerminalServerMessage_Output:
			_, _ = w.Write(m.Output)
		case *agentv1.TerminalServerMessage_Exit:
			exit = m.Exit
		}
	}
}

// terminalExitStatus is the shell's exit code for an ended session: its
// code, or 128+N when signal N ended it.
func terminalExitStatus(e *agentv1.TerminalExit) int {
	if e.GetSignal() != "" && e.GetExitCode() < 0 {
		return 128 + signalNumber(e.GetSignal())
	}
	return int(e.GetExitCode())
}

// forwardSignals handles this process's signals while the session runs:
// SIGWINCH resizes the session; SIGINT (which a raw terminal never sends,
// only kill(1) or a non-terminal parent) is passed on as INT; SIGTERM and
// SIGHUP detach, leaving the session running. It returns the function that
// stops the handling.
func forwardSignals(ctx context.Context, s *termSender, lt localTerm, detach func()) func() {
	ch := make(chan os.Signal, 4)
	signal.Notify(ch, syscall.SIGWINCH, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-done:
				return
			case sig := <-ch:
				switch sig {
				case syscall.SIGWINCH:
					s.resize(lt)
				case syscall.SIGINT:
					s.send(&agentv1.TerminalClientMessage{Msg: &agentv1.TerminalClientMessage_Signal{Signal: "INT"}})
				default:
					detach()
				}
			}
		}
	}()
	return func() {
		signal.Stop(ch)
		close(done)
	}
}

// pumpInput sends what is read from in to the session as typed, until in
// ends (then the input side of the stream is closed) or the detach keys
// come.
func pumpInput(in io.Reader, s *termSender, keys []byte, detach func()) {
	if in == nil {
		s.closeSend()
		return
	}
	dk := &detachKeys{keys: keys}
	buf := make([]byte, 32<<10)
	for {
		n, err := in.Read(buf)
		if n > 0 {
			data, hit := dk.filter(buf[:n])
			if len(data) > 0 && !s.send(&agentv1.TerminalClientMessage{Msg: &agentv1.TerminalClientMessage_Input{Input: data}}) {
				return
			}
			if hit {
				detach()
				return
			}
		}
		if err != nil {
			s.closeSend()
			return
		}
	}
}

// termSender serialises the messages of the input, resize and signal
// goroutines on the stream (gRPC allows one sender at a time).
type termSender struct {
	mu     sync.Mutex
	stream agentv1.TerminalService_ConnectClient
	done   bool
}

// send sends m and reports whether the stream still takes messages.
func (s *termSender) send(m *agentv1.TerminalClientMessage) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		return false
	}
	if err := s.stream.Send(m); err != nil {
		s.done = true
	}
	return !s.done
}

// resize sends the local terminal's size.
func (s *termSender) resize(lt localTerm) {
	rows, cols, ok := lt.size()
	if !ok {
		return
	}
	s.send(&agentv1.TerminalClientMessage{Msg: &agentv1.TerminalClientMessage_Resize{Resize: &agentv1.TerminalResize{Rows: rows, Cols: cols}}})
}

// closeSend ends the input side of the stream.
func (s *termSender) closeSend() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.done {
		s.done = true
		_ = s.stream.CloseSend()
	}
}

// runList prints the sandbox's terminal sessions.
func (o *shellOptions) runList(ctx context.Context, env Env, lease string) error {
	sc, err := o.open(ctx, lease)
	if err != nil {
		return err
	}
	defer sc.conn.Close()
	resp, err := agentv1.NewTerminalServiceClient(sc.conn).ListTerminals(sc.ctx, &agentv1.ListTerminalsRequest{})
	if err != nil {
		return fail(err)
	}
	if o.output == outJSON || o.output == outYAML {
		return fail(printMessage(env.Stdout, o.output, resp))
	}
	t := &table{}
	t.addRow([]string{"ID", "STATE", "PID", "CLIENTS", "SIZE", "USER", "AGE", "COMMAND"})
	for _, s := range resp.GetSessions() {
		age := "-"
		if s.GetStartedAt() != nil {
			age = time.Since(s.GetStartedAt().AsTime()).Round(time.Second).String()
		}
		command := s.GetCommand()
		if command == "" {
			command = strings.Join(s.GetArgv(), " ")
		}
		t.addRow([]string{safe(s.GetId()), sessionState(s), strconv.Itoa(int(s.GetPid())), strconv.Itoa(int(s.GetClients())),
			fmt.Sprintf("%dx%d", s.GetRows(), s.GetCols()), safe(s.GetUser()), age, safe(command)})
	}
	t.flush(env.Stdout)
	return nil
}

// sessionState is "running", "exited N" or "killed SIGNAL".
func sessionState(s *agentv1.TerminalInfo) string {
	switch e := s.GetExit(); {
	case s.GetRunning():
		return "running"
	case e.GetSignal() != "":
		return "killed " + safe(e.GetSignal())
	default:
		return "exited " + strconv.Itoa(int(e.GetExitCode()))
	}
}

// runKill ends (or signals) a session and prints its id.
func (o *shellOptions) runKill(ctx context.Context, env Env, lease string) error {
	sc, err := o.open(ctx, lease)
	if err != nil {
		return err
	}
	defer sc.conn.Close()
	if _, err := agentv1.NewTerminalServiceClient(sc.conn).KillTerminal(sc.ctx, &agentv1.KillTerminalRequest{Id: o.kill, Signal: o.signal}); err != nil {
		return fail(err)
	}
	fmt.Fprintln(env.Stdout, safe(o.kill))
	return nil
}
