package terminal

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berth-dev/berth/internal/edge"
	"github.com/berth-dev/berth/pkg/errdefs"
)

const (
	// Subprotocol is the WebSocket subprotocol of the framing; a client
	// that offers it (Sec-WebSocket-Protocol) gets it selected. Offering it
	// is optional.
	Subprotocol = "berth.terminal.v1"
	// MaxInputFrame bounds one WebSocket message from a client.
	MaxInputFrame = 1 << 20
	// wsWriteTimeout bounds one write to a WebSocket client; a client that
	// does not read for this long is disconnected.
	wsWriteTimeout = 30 * time.Second
)

// Control is a WebSocket text message, in either direction (see
// docs/terminals.md): "resize" (Rows, Cols) and "signal" (Signal) from
// clients; "session" (ID, Pid, Rows, Cols, Term), "exit" (Code, Signal)
// and "error" (Message) from the agent.
type Control struct {
	Type    string   `json:"type"`
	ID      string   `json:"id,omitempty"`
	Pid     int      `json:"pid,omitempty"`
	Argv    []string `json:"argv,omitempty"`
	User    string   `json:"user,omitempty"`
	Term    string   `json:"term,omitempty"`
	Rows    int      `json:"rows,omitempty"`
	Cols    int      `json:"cols,omitempty"`
	Signal  string   `json:"signal,omitempty"`
	Code    *int     `json:"code,omitempty"`
	Message string   `json:"message,omitempty"`
}

// WebSocket returns the handler of GET /v1/terminals/ws: it opens a
// session from the query (argv, command, cwd, user, env=NAME=VALUE, rows,
// cols, term), or attaches to one (session=ID, replay=false to skip the
// scrollback), and upgrades to a WebSocket whose binary messages are the
// terminal's bytes both ways and whose text messages are Control JSON.
// Errors before the upgrade are JSON error bodies with the usual statuses.
// It does not authenticate: mount it behind the agent's token check.
//
// Any Origin is accepted: the agent's routes accept only a bearer token in
// the Authorization header, which a browser never attaches on its own, so
// a cross-site page gains nothing from connecting (and through the proxy
// the Origin never matches the agent's address anyway).
func WebSocket(m *Manager) http.Handler { return &wsHandler{m: m} }

type wsHandler struct{ m *Manager }

func (h *wsHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		edge.WriteJSONErrorStatus(w, http.StatusMethodNotAllowed, status.New(codes.Unimplemented, "method not allowed: use GET with a WebSocket upgrade"))
		return
	}
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		w.Header().Set("Upgrade", "websocket")
		edge.WriteJSONErrorStatus(w, http.StatusUpgradeRequired, status.New(codes.InvalidArgument, "this route is a WebSocket: send Upgrade: websocket"))
		return
	}
	att, opened, err := h.attach(r.URL.Query())
	if err != nil {
		edge.WriteError(w, err)
		return
	}
	defer att.Detach()
	sess := att.Session()
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true, Subprotocols: []string{Subprotocol}})
	if err != nil {
		// Accept answered the client; a session opened for it has no use.
		if opened {
			sess.stop()
		}
		return
	}
	c.SetReadLimit(MaxInputFrame)
	// The request's context is not cancelled when a hijacked client goes
	// away; the reader below notices that.
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(r.Context()))
	defer cancel(nil)

	in := sess.Info()
	if err := writeControl(ctx, c, Control{Type: "session", ID: in.ID, Pid: in.Pid, Argv: in.Argv, User: in.User,
		Term: in.Term, Rows: in.Rows, Cols: in.Cols}); err != nil {
		_ = c.CloseNow()
		return
	}
	go h.readClient(ctx, cancel, c, sess)
	err = follow(ctx, att,
		func(b []byte) error {
			wctx, wcancel := context.WithTimeout(ctx, wsWriteTimeout)
			defer wcancel()
			return c.Write(wctx, websocket.MessageBinary, b)
		},
		func(e Exit) error {
			return writeControl(ctx, c, Control{Type: "exit", Code: &e.Code, Signal: e.Signal})
		})
	switch {
	case err == nil:
		_ = c.Close(websocket.StatusNormalClosure, "session ended")
	case errors.Is(err, ErrSlowClient):
		_ = c.Close(websocket.StatusTryAgainLater, "client too slow; re-attach")
	default: // the client went away, or a write failed
		_ = c.CloseNow()
	}
}

// readClient writes binary messages to the terminal and carries out
// control messages until the client closes or fails; then it cancels ctx.
func (h *wsHandler) readClient(ctx context.Context, cancel context.CancelCauseFunc, c *websocket.Conn, sess *Session) {
	for {
		typ, data, err := c.Read(ctx)
		if err != nil {
			cancel(err)
			return
		}
		if typ == websocket.MessageBinary {
			if _, err := sess.Write(data); err != nil && !errors.Is(err, errEnded) {
				cancel(err)
				return
			}
			continue
		}
		var msg Control
		switch err = json.Unmarshal(data, &msg); {
		case err != nil:
			err = errdefs.InvalidArgument("message", "text messages are JSON control messages: %v", err)
		case msg.Type == "resize":
			err = sess.Resize(msg.Rows, msg.Cols)
		case msg.Type == "signal":
			err = signal(sess, msg.Signal)
		default:
			err = errdefs.InvalidArgument("type", "unknown control message type %q (want resize or signal)", msg.Type)
		}
		if err != nil && !errors.Is(err, errEnded) {
			// Refused controls are answered and the connection goes on.
			if werr := writeControl(ctx, c, Control{Type: "error", Message: err.Error()}); werr != nil {
				cancel(werr)
				return
			}
		}
	}
}

func writeControl(ctx context.Context, c *websocket.Conn, msg Control) error {
	b, err := json.Marshal(msg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, wsWriteTimeout)
	defer cancel()
	return c.Write(ctx, websocket.MessageText, b)
}

// attach opens or attaches as the query says; opened reports a new session.
func (h *wsHandler) attach(q url.Values) (*Attachment, bool, error) {
	for k := range q {
		switch k {
		case "session", "replay", "argv", "command", "cwd", "user", "env", "rows", "cols", "term":
		default:
			return nil, false, errdefs.InvalidArgument(k, "unknown query parameter")
		}
	}
	if id := q.Get("session"); id != "" {
		replay := true
		if v := q.Get("replay"); v != "" {
			b, err := strconv.ParseBool(v)
			if err != nil {
				return nil, false, errdefs.InvalidArgument("replay", "%q is not a boolean", v)
			}
			replay = b
		}
		a, err := h.m.Attach(id, replay)
		return a, false, err
	}
	spec := Spec{Argv: q["argv"], Command: q.Get("command"), Cwd: q.Get("cwd"), User: q.Get("user"), Term: q.Get("term")}
	for _, kv := range q["env"] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, false, errdefs.InvalidArgument("env", "%q is not NAME=VALUE", kv)
		}
		if spec.Env == nil {
			spec.Env = make(map[string]string)
		}
		spec.Env[k] = v
	}
	for _, f := range []struct {
		name string
		dst  *int
	}{{"rows", &spec.Rows}, {"cols", &spec.Cols}} {
		if v := q.Get(f.name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil {
				return nil, false, errdefs.InvalidArgument(f.name, "%q is not a number", v)
			}
			*f.dst = n
		}
	}
	sess, err := h.m.Open(spec)
	if err != nil {
		return nil, false, err
	}
	return sess.Attach(true), true, nil
}
