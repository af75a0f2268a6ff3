package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/berth-dev/berth/pkg/runtime"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// fuzzTarget is what the generator may aim at: one live lease (for the
// proxy) and the tokens there are.
type fuzzTarget struct {
	leaseID, leaseToken string
}

// fuzzReq is one generated request: raw bytes for the HTTP listener, or a
// gRPC call.
type fuzzReq struct {
	area   string // "api", "proxy", "preview", "raw", "grpc"
	raw    []byte
	stream bool // may legitimately stay open (watch, streams)
	// incomplete: the bytes end before the request's headers do, so the
	// server rightly waits for more (until its header timeout).
	incomplete bool
	grpc       func(ctx context.Context, conn *grpc.ClientConn) error
	desc       string
}

// fuzzGen generates requests from a seeded source: the same seed gives
// the same sequence.
type fuzzGen struct {
	r *rand.Rand
	t fuzzTarget
}

func (g *fuzzGen) pick(xs ...string) string { return xs[g.r.IntN(len(xs))] }
func (g *fuzzGen) chance(p float64) bool    { return g.r.Float64() < p }

// str is a random string: printable, unicode, control characters, tricks.
func (g *fuzzGen) str() string {
	switch g.r.IntN(10) {
	case 0:
		return ""
	case 1:
		return strings.Repeat("a", 1+g.r.IntN(70000))
	case 2:
		return "\x1b[31mred\x00\r\n\t"
	case 3:
		return "ü漢字🙂\u202e"
	case 4:
		return g.pick("..", "../../etc/passwd", "%2e%2e", "/", "//", "a/b", "a:b", "*", "=", ",", "a=b,c!=d", "\\")
	case 5:
		return g.pick("null", "true", "NaN", "-1", "1e309", "0x10")
	default:
		const alpha = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.~"
		b := make([]byte, 1+g.r.IntN(40))
		for i := range b {
			b[i] = alpha[g.r.IntN(len(alpha))]
		}
		return string(b)
	}
}

// num is a random JSON number or number-like value.
func (g *fuzzGen) num() any {
	switch g.r.IntN(14) {
	case 0:
		return -1
	case 1:
		return 0
	case 2:
		return math.MaxInt64
	case 3:
		return json.Number("9223372036854775808") // overflows int64
	case 4:
		return json.Number("1e308")
	case 5:
		return json.Number("-1e308")
	case 6:
		return "NaN"
	case 7:
		return "Infinity"
	case 8:
		return "-Infinity"
	case 9:
		return 1.5
	case 10:
		return g.str()
	case 11:
		return []any{1, 2}
	case 12:
		return map[string]any{"a": 1}
	default:
		return g.r.IntN(1 << 20)
	}
}

// dur is a random duration value (protojson: "600s").
func (g *fuzzGen) dur() any {
	switch g.r.IntN(8) {
	case 0:
		return "600s"
	case 1:
		return "-5s"
	case 2:
		return "315576000001s"
	case 3:
		return "1.5s"
	case 4:
		return "10m"
	case 5:
		return g.num()
	default:
		return g.str()
	}
}

// anyVal is any JSON value.
func (g *fuzzGen) anyVal() any {
	switch g.r.IntN(6) {
	case 0:
		return g.str()
	case 1:
		return g.num()
	case 2:
		return g.chance(0.5)
	case 3:
		return nil
	case 4:
		return []any{g.str(), g.num()}
	default:
		return map[string]any{g.str(): g.str()}
	}
}

func (g *fuzzGen) strMap() any {
	if g.chance(0.2) {
		return g.anyVal()
	}
	m := map[string]any{}
	for range g.r.IntN(4) {
		if g.chance(0.8) {
			m[g.str()] = g.str()
		} else {
			m[g.str()] = g.anyVal()
		}
	}
	if g.chance(0.05) {
		for i := range 3000 {
			m["k"+strconv.Itoa(i)] = strings.Repeat("v", 100)
		}
	}
	return m
}

// image is a random image reference: mostly invalid or absent ones.
func (g *fuzzGen) image() any {
	if g.chance(0.1) {
		return g.anyVal()
	}
	return g.pick("", "berth/minimal", "berth/minimal:latest", "berth/base", "BERTH/UPPER", "../../x", "a//b", "busybox",
		"berth/none:"+strconv.Itoa(g.r.IntN(100)), "localhost:5000/x", strings.Repeat("a", 300), "x@sha256:00", g.str())
}

// acquireBody is a JSON acquire request with random field values.
func (g *fuzzGen) acquireBody() map[string]any {
	b := map[string]any{}
	set := func(k string, v func() any) {
		if g.chance(0.5) {
			b[k] = v()
		}
	}
	set("conversationId", func() any { return g.str() })
	set("image", g.image)
	set("ttl", g.dur)
	set("idleTimeout", g.dur)
	set("labels", g.strMap)
	set("env", g.strMap)
	set("owner", func() any { return g.str() })
	set("user", func() any { return g.pick("root", "0", "1000:1000", "sandbox", "nobody", "../", g.str()) })
	set("publicPorts", func() any { return []any{g.num(), g.num()} })
	set("resources", func() any {
		return map[string]any{"cpus": g.num(), "memoryBytes": g.num(), "pids": g.num(), "diskBytes": g.num()}
	})
	if g.chance(0.1) {
		b[g.str()] = g.anyVal() // unknown field
	}
	return b
}

// execBody is an agent exec request with harmless commands and random
// options.
func (g *fuzzGen) execBody() map[string]any {
	b := map[string]any{}
	argv := [][]any{{"true"}, {"echo", g.str()}, {"/nonexistent"}, {}, {""}, {"sh", "-c", "exit 3"}, {g.num()}}
	if g.chance(0.8) {
		b["argv"] = argv[g.r.IntN(len(argv))]
	}
	if g.chance(0.2) {
		b["command"] = g.pick("echo hi", "", "exit 7", "true")
	}
	if g.chance(0.3) {
		b["timeout"] = g.dur()
	}
	if g.chance(0.3) {
		b["outputLimit"] = g.num()
	}
	if g.chance(0.3) {
		b["cwd"] = g.pick("/", "..", "../../..", "/nonexistent", "/tmp", g.str())
	}
	if g.chance(0.3) {
		b["env"] = g.strMap()
	}
	if g.chance(0.2) {
		b["user"] = g.pick("root", "sandbox", "1000", "99999:99999", g.str())
	}
	if g.chance(0.2) {
		b["stdinData"] = g.str()
	}
	if g.chance(0.1) {
		b["killGrace"] = g.dur()
	}
	return b
}

// body marshals v, or returns malformed JSON instead.
func (g *fuzzGen) body(v any) []byte {
	switch g.r.IntN(12) {
	case 0:
		return []byte(`{"conversationId":`)
	case 1:
		return []byte(strings.Repeat("[", 20000) + strings.Repeat("]", 20000))
	case 2:
		b := make([]byte, g.r.IntN(2000))
		for i := range b {
			b[i] = byte(g.r.IntN(256))
		}
		return b
	case 3:
		return []byte(g.pick("", "null", "[]", "1", `"x"`, "{}", `{"a":1,"a":2}`, "{\"conversationId\":\"\xff\xfe\"}"))
	case 4:
		if g.chance(0.3) {
			return []byte(`{"conversationId":"` + strings.Repeat("x", 5<<20) + `"}`)
		}
	}
	b, err := json.Marshal(v)
	if err != nil {
		return []byte("{}")
	}
	return b
}

// id is a lease id: the live one, a random one or a trick.
func (g *fuzzGen) id() string {
	switch g.r.IntN(8) {
	case 0, 1, 2:
		return g.t.leaseID
	case 3:
		return strings.ToUpper(g.t.leaseID)
	case 4:
		return g.pick("..", "%2e%2e", "%2F", ".", "", "x%00y", "%", "%zz", strings.Repeat("z", 5000))
	default:
		return g.str()
	}
}

// token is an Authorization header value (or "" for none).
func (g *fuzzGen) token() string {
	switch g.r.IntN(10) {
	case 0, 1:
		return "Bearer " + operatorToken
	case 2, 3:
		return "Bearer " + g.t.leaseToken
	case 4:
		return ""
	case 5:
		return g.pick("Bearer", "Bearer ", "Basic dXNlcjpwYXNz", "bearer "+operatorToken, "Bearer  "+operatorToken)
	case 6:
		return "Bearer " + g.t.leaseID + ".AAAA"
	case 7:
		return "Bearer " + strings.Repeat("t", 1+g.r.IntN(200000))
	default:
		return "Bearer " + g.str()
	}
}

func (g *fuzzGen) method(usual string) string {
	if g.chance(0.75) {
		return usual
	}
	return g.pick("GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "TRACE", "CONNECT", "PROPFIND", "get", "FOO", "G@T", strings.Repeat("M", 3000))
}

// pathTrick rewrites a path with traversal and encoding tricks.
func (g *fuzzGen) pathTrick(p string) string {
	switch g.r.IntN(10) {
	case 0:
		return p + "/.."
	case 1:
		return strings.Replace(p, "/v1/", "/v1/../v1/", 1)
	case 2:
		return strings.Replace(p, "/", "//", 2)
	case 3:
		return p + "/%2e%2e/%2e%2e/etc/passwd"
	case 4:
		return p + "/" + strings.Repeat("seg/", 2000)
	case 5:
		return p + "?" + strings.Repeat("q=1&", 1+g.r.IntN(3000))
	case 6:
		return p + "%00"
	case 7:
		return p + "#frag"
	case 8:
		return strings.ToUpper(p)
	default:
		return p + ":" + g.str()
	}
}

// httpReq assembles a raw HTTP/1.1 request.
func (g *fuzzGen) httpReq(method, path, host string, body []byte, auth string) []byte {
	var b bytes.Buffer
	proto := "HTTP/1.1"
	if g.chance(0.02) {
		proto = g.pick("HTTP/1.0", "HTTP/2.0", "HTTP/9.9", "HTTX/1.1", "")
	}
	if g.chance(0.15) {
		path = g.pathTrick(path)
	}
	fmt.Fprintf(&b, "%s %s %s\r\n", method, path, proto)
	if host != "" || g.chance(0.9) {
		fmt.Fprintf(&b, "Host: %s\r\n", host)
	}
	if auth != "" {
		fmt.Fprintf(&b, "Authorization: %s\r\n", auth)
	}
	if g.chance(0.1) {
		fmt.Fprintf(&b, "Cookie: %s\r\n", g.pick("berth_token="+g.t.leaseToken, "berth_token ="+g.t.leaseToken, "berth_token=", "a=b; berth_token=x; berth_token=y", g.str()))
	}
	if g.chance(0.1) {
		fmt.Fprintf(&b, "%s: %s\r\n", g.pick("X-Berth-Lease", "Content-Type", "Accept", "Connection", "Expect", "Upgrade", "X-Forwarded-For", "Grpc-Timeout", "Te", "Range"),
			g.pick("application/grpc", "text/plain", "*/*", "close", "websocket", "1H", "bytes=0-1,-5", "trailers", g.t.leaseID, g.str()))
	}
	if g.chance(0.03) {
		b.WriteString("Bad Header\r\n")
	}
	if g.chance(0.02) {
		fmt.Fprintf(&b, "X-Big: %s\r\n", strings.Repeat("h", 1<<20+g.r.IntN(1000)))
	}
	switch {
	case body == nil:
	case g.chance(0.05):
		// chunked, sometimes malformed
		b.WriteString("Transfer-Encoding: chunked\r\n\r\n")
		if g.chance(0.5) {
			fmt.Fprintf(&b, "%x\r\n%s\r\n0\r\n\r\n", len(body), body)
		} else {
			fmt.Fprintf(&b, "zz\r\n%s\r\n", body)
		}
		return b.Bytes()
	case g.chance(0.05):
		// a Content-Length smaller than the body, or negative
		fmt.Fprintf(&b, "Content-Length: %s\r\n\r\n%s", g.pick("-1", "1", "0", "abc", "99999999999999999999"), body)
		return b.Bytes()
	default:
		fmt.Fprintf(&b, "Content-Type: application/json\r\nContent-Length: %d\r\n", len(body))
	}
	b.WriteString("\r\n")
	b.Write(body)
	return b.Bytes()
}

// next generates one request.
func (g *fuzzGen) next() fuzzReq {
	host := "127.0.0.1"
	switch n := g.r.IntN(100); {
	case n < 40: // lease API
		var method, path string
		var body []byte
		stream := false
		switch g.r.IntN(7) {
		case 0, 1:
			method, path, body = "POST", "/v1/leases", g.body(g.acquireBody())
		case 2:
			q := []string{}
			for range g.r.IntN(4) {
				q = append(q, g.pick("state", "owner", "labelSelector", "pageSize", "pageToken", "includeEnded", "conversationId", g.str())+"="+
					g.pick("LEASE_STATE_READY", "7", "FOO", "-1", "99999999999", "true", "yes", "a%3Db", "%zz", g.str()))
			}
			method, path = "GET", "/v1/leases?"+strings.Join(q, "&")
		case 3:
			method, path = "GET", "/v1/leases/"+g.id()
		case 4:
			id := g.id()
			if id == g.t.leaseID {
				id = g.str() // the proxy's lease stays
			}
			method, path = "DELETE", "/v1/leases/"+id
			if g.chance(0.5) {
				body = g.body(map[string]any{"reason": g.str()})
			}
		case 5:
			id := g.id()
			if id == g.t.leaseID {
				id = g.str() // a short ttl would end the proxy's lease
			}
			method, path, body = "POST", "/v1/leases/"+id+":renew", g.body(map[string]any{"ttl": g.dur()})
		default:
			if g.chance(0.5) {
				// reap with anything but the operator's all-selector
				b := map[string]any{"ids": []any{g.str()}, "labelSelector": g.str(), "reason": g.str(), "all": g.chance(0.5)}
				method, path, body = "POST", "/v1/leases:reap", g.body(b)
			} else {
				method, path, stream = "GET", "/v1/leases:watch?leaseId="+g.id(), true
			}
		}
		auth := g.token()
		if strings.HasSuffix(path, ":reap") && auth == "Bearer "+operatorToken {
			auth = "Bearer " + g.t.leaseToken // never reap everything
		}
		return fuzzReq{area: "api", raw: g.httpReq(g.method(method), path, host, body, auth), stream: stream, desc: method + " " + trunc(path, 80)}
	case n < 75: // proxy path routes
		id := g.id()
		base := "/v1/sandboxes/" + id
		var method, path string
		var body []byte
		stream := false
		switch g.r.IntN(8) {
		case 0, 1:
			method, path, body = "POST", base+"/v1/exec", g.body(g.execBody())
		case 2:
			method, path, body, stream = "POST", base+"/v1/exec:stream", g.body(g.execBody()), true
		case 3:
			p := g.pick("workspace/f.txt", "tmp/../../etc/hostname", "%2e%2e/%2e%2e/etc/passwd", "", "/", "a//b", "nonexistent/dir/f", strings.Repeat("d/", 600)+"f")
			method, path = g.pick("GET", "PUT", "POST", "HEAD"), base+"/v1/files/"+p
			if method != "GET" && method != "HEAD" {
				body = []byte(g.str())
			}
		case 4:
			method, path = "GET", base+"/v1/fs:"+g.pick("stat", "list")+"?path="+g.pick("/", "..", "%2e%2e", "/proc/self/environ", "/etc/passwd", g.str())
		case 5:
			method, path, body = "POST", base+"/v1/fs:"+g.pick("mkdir", "move", "remove"), g.body(map[string]any{"path": "/tmp/fuzz-" + g.str(), "recursive": false, "from": g.str(), "to": "/tmp/fuzz-x"})
		case 6:
			method, path = "GET", base+"/ports/"+g.pick("8000", "0", "-1", "65536", "7000", "22", "abc", "")+"/"+g.str()
		default:
			method, path = g.pick("GET", "POST"), base+g.pick("/v1/processes", "/v1/processes/"+g.str(), "/v1/processes/1:signal", "/v1/info", "/v1/git/status?path=/", "/v1/git/log", "/healthz", "/", "")
			if method == "POST" {
				body = g.body(map[string]any{"signal": g.pick("SIGKILL", "SIGTERM", "9", "0", "-1"), "argv": []string{"true"}})
			}
		}
		auth := g.token()
		if strings.Contains(path, ":signal") {
			auth = "Bearer x" // never signal the agent's own processes with a real token
		}
		return fuzzReq{area: "proxy", raw: g.httpReq(g.method(method), path, host, body, auth), stream: stream, desc: method + " " + trunc(path, 80)}
	case n < 85: // preview hosts
		port := g.pick("8000", "0", "70000", "7000", "x", "")
		h := g.pick(port+"-"+g.t.leaseID+".sandbox.localhost", port+"-"+g.t.leaseID+".sandbox.localhost:7070", port+"-"+g.str()+".sandbox.localhost",
			"-.sandbox.localhost", ".sandbox.localhost", "x.y.z.sandbox.localhost", g.str()+".sandbox.localhost", "evil.example", "", strings.Repeat("a.", 200)+"sandbox.localhost")
		path := g.pick("/", "/?berth_token="+g.t.leaseToken, "/?berth_token="+g.str(), "//evil.example/x?berth_token="+g.t.leaseToken, "/%2F%2Fevil.example", "/\\evil.example", "/a?b#c")
		return fuzzReq{area: "preview", raw: g.httpReq(g.method("GET"), path, h, nil, g.pick("", "", "Bearer "+g.t.leaseToken)), desc: "GET " + trunc(h, 60) + trunc(path, 40)}
	case n < 92: // raw protocol garbage
		var b []byte
		switch g.r.IntN(5) {
		case 0:
			b = append([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), g.body(nil)...)
		case 1:
			b = g.body(nil)
		case 2:
			b = []byte(g.pick("GET http://evil.example/ HTTP/1.1\r\nHost: evil.example\r\n\r\n", "CONNECT 127.0.0.1:22 HTTP/1.1\r\nHost: x\r\n\r\n",
				"GET /healthz HTTP/1.1\r\n\r\n", "GET / HTTP/1.1\nHost: x\n\n", "\r\n\r\n", "GET /healthz HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"))
		case 3:
			b = []byte("GET /" + strings.Repeat("x", 100000) + " HTTP/1.1\r\nHost: x\r\n\r\n")
		default:
			b = []byte("POST /v1/leases HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /x HTTP/1.1\r\n\r\n")
		}
		// After the HTTP/2 preface the server waits for whole frames.
		incomplete := bytes.HasPrefix(b, []byte("PRI * HTTP/2.0")) || (!bytes.Contains(b, []byte("\r\n\r\n")) && !bytes.Contains(b, []byte("\n\n")))
		return fuzzReq{area: "raw", raw: b, incomplete: incomplete, desc: "raw " + trunc(strconv.Quote(string(b)), 60)}
	default: // gRPC
		return g.grpcReq()
	}
}

// printable reports whether s is printable ASCII (what gRPC's client sends
// as a metadata value).
func printable(s string) bool {
	return strings.IndexFunc(s, func(r rune) bool { return r < 0x20 || r > 0x7e }) < 0
}

// rawCodec sends bytes as they are (garbage messages to agent services).
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) {
	if b, ok := v.(*[]byte); ok {
		return *b, nil
	}
	return nil, errors.New("rawCodec: not *[]byte")
}
func (rawCodec) Unmarshal(data []byte, v any) error {
	if b, ok := v.(*[]byte); ok {
		*b = append((*b)[:0], data...)
		return nil
	}
	return errors.New("rawCodec: not *[]byte")
}
func (rawCodec) Name() string { return "proto" }

var _ encoding.Codec = rawCodec{}

func (g *fuzzGen) grpcReq() fuzzReq {
	md := []string{}
	// Only values gRPC's client will send (it refuses non-printable ones).
	if tok := g.token(); tok != "" && len(tok) < 70000 && printable(tok) {
		md = append(md, "authorization", tok)
	}
	f64 := func() float64 {
		return []float64{math.NaN(), math.Inf(1), math.Inf(-1), -1, 0, 1e308, 4096, 0.5}[g.r.IntN(8)]
	}
	i64 := func() int64 { return []int64{-1, 0, math.MaxInt64, math.MinInt64, 1 << 50, 64 << 20}[g.r.IntN(6)] }
	switch g.r.IntN(5) {
	case 0:
		req := &orchv1.AcquireRequest{ConversationId: g.str(), Image: fmt.Sprint(g.image()), Owner: g.str(), User: g.str(),
			Resources:   &orchv1.Resources{Cpus: f64(), MemoryBytes: i64(), Pids: i64(), DiskBytes: i64()},
			Labels:      map[string]string{g.str(): g.str()},
			PublicPorts: []int32{int32(g.r.Int64N(1<<32) - 1<<31)}}
		return fuzzReq{area: "grpc", desc: "grpc Acquire", grpc: func(ctx context.Context, c *grpc.ClientConn) error {
			_, err := orchv1.NewLeaseServiceClient(c).Acquire(metadata.AppendToOutgoingContext(ctx, md...), req)
			return err
		}}
	case 1:
		id := g.id()
		if id == g.t.leaseID {
			id = g.str()
		}
		return fuzzReq{area: "grpc", desc: "grpc Get/Renew", grpc: func(ctx context.Context, c *grpc.ClientConn) error {
			cl := orchv1.NewLeaseServiceClient(c)
			ctx = metadata.AppendToOutgoingContext(ctx, md...)
			if _, err := cl.Get(ctx, &orchv1.GetLeaseRequest{Id: id}); status.Code(err) != codes.OK {
				return err
			}
			_, err := cl.Renew(ctx, &orchv1.RenewRequest{Id: id})
			return err
		}}
	case 2:
		req := &orchv1.ListLeasesRequest{LabelSelector: g.str(), PageSize: int32(g.r.Int64N(1<<32) - 1<<31), PageToken: g.str(), Owner: g.str(), State: orchv1.LeaseState(g.r.IntN(20) - 5)}
		return fuzzReq{area: "grpc", desc: "grpc List", grpc: func(ctx context.Context, c *grpc.ClientConn) error {
			_, err := orchv1.NewLeaseServiceClient(c).List(metadata.AppendToOutgoingContext(ctx, md...), req)
			return err
		}}
	default:
		// An agent RPC through the proxy with a garbage message.
		msg := g.body(nil)
		method := g.pick("/berth.agent.v1.ProcessService/Exec", "/berth.agent.v1.FileService/Stat", "/berth.agent.v1.Nope/X", "/x", "//", "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo")
		lid := g.id()
		if !printable(lid) {
			lid = "x"
		}
		lmd := append(md, "x-berth-lease", lid)
		return fuzzReq{area: "grpc", desc: "grpc " + method, grpc: func(ctx context.Context, c *grpc.ClientConn) error {
			var out []byte
			return c.Invoke(metadata.AppendToOutgoingContext(ctx, lmd...), method, &msg, &out, grpc.ForceCodec(rawCodec{}))
		}}
	}
}

// fuzzResult is the outcome of one request: an HTTP status, a gRPC code,
// or "closed"/"timeout".
type fuzzResult struct {
	req     fuzzReq
	status  int
	code    codes.Code
	outcome string // "http", "grpc", "closed", "timeout", "error"
	detail  string
	took    time.Duration
}

// send sends a raw request on a new connection and reads the answer's
// status line and headers.
func sendRaw(addr string, raw []byte, timeout time.Duration) (int, string, error) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return 0, "error", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	werr := make(chan error, 1)
	go func() {
		_, err := c.Write(raw)
		werr <- err
	}()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return 0, "timeout", err
		}
		return 0, "closed", err
	}
	// The body is not read (a HEAD answer has none to wait for); closing
	// the connection discards it.
	return resp.StatusCode, "http", nil
}

// documented5xx are the 5xx answers the API documents: the proxy's 502
// (agent unreachable), 503 (unavailable) and 504 (upstream timeout), 507
// (the sandbox's disk limit), and Go's HTTP server's 505 to a request line
// naming an HTTP version other than 1.x (RFC 9110 §15.6.6; no handler runs).
func documented5xx(code int) bool {
	return code == 502 || code == 503 || code == 504 || code == 505 || code == 507
}

// grpcServerFault reports whether a gRPC answer is the equivalent of an
// undocumented 5xx. grpc-go itself answers INTERNAL to a message it cannot
// decode ("grpc: error unmarshalling request", on streams "failed to
// unmarshal the received message"): that is the protocol's
// documented answer to garbage, not a fault of berth's handlers.
func grpcServerFault(code codes.Code, msg string) bool {
	switch code {
	case codes.Internal:
		return !strings.Contains(msg, "error unmarshalling request") && !strings.Contains(msg, "failed to unmarshal the received message")
	case codes.Unknown, codes.DataLoss:
		return true
	}
	return false
}

// chaosFuzz sends generated requests to the lease API, the proxy (path
// routes and preview hosts), the gRPC API and the raw listener, and checks
// there is no panic and no 5xx other than the documented ones.
func chaosFuzz(t *testing.T, cfg chaosSizes, table *chaosTable) {
	row := &chaosRow{name: fmt.Sprintf("fuzz: %d requests, seed %d (API, proxy, preview, gRPC, raw)", cfg.fuzzRequests, cfg.fuzzSeed), runs: 1, pass: true, order: 400}
	table.add(row)
	defer func(t0 time.Time) { row.took = time.Since(t0) }(time.Now())
	dir, instance := newDataDir(t)
	addr := freeAddr(t)
	// Few slots: a generated acquire that happens to be valid creates at
	// most a few sandboxes.
	p := startProc(t, dir, addr, "BERTH_MAX_LEASES=4")
	target := p.mustAcquire(t, "fuzz-target", minimalImage, "1800s")
	g := &fuzzGen{r: rand.New(rand.NewPCG(uint64(cfg.fuzzSeed), 4)), t: fuzzTarget{leaseID: target.GetLease().GetId(), leaseToken: target.GetToken()}}
	reqs := make([]fuzzReq, cfg.fuzzRequests)
	for i := range reqs {
		reqs[i] = g.next()
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	const workers = 8
	results := make([]fuzzResult, len(reqs))
	var wg sync.WaitGroup
	next := make(chan int)
	t0 := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				r := fuzzResult{req: reqs[i]}
				began := time.Now()
				if reqs[i].grpc != nil {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					err := reqs[i].grpc(ctx, conn)
					cancel()
					r.outcome, r.code = "grpc", status.Code(err)
					if err != nil {
						r.detail = trunc(err.Error(), 200)
					}
				} else {
					// A stream or an incomplete request is expected to
					// stay unanswered: wait less for it.
					wait := 5 * time.Second
					if reqs[i].stream || reqs[i].incomplete {
						wait = time.Second
					}
					code, outcome, err := sendRaw(addr, reqs[i].raw, wait)
					r.status, r.outcome = code, outcome
					if err != nil {
						r.detail = trunc(err.Error(), 200)
					}
				}
				r.took = time.Since(began)
				results[i] = r
			}
		}()
	}
	for i := range reqs {
		next <- i
	}
	close(next)
	wg.Wait()
	took := time.Since(t0)

	var lat []time.Duration
	for _, r := range results {
		if r.outcome == "http" || r.outcome == "grpc" {
			lat = append(lat, r.took)
		}
	}
	classes := map[string]int{}
	var bad []string
	badCount, timeouts := 0, 0
	for _, r := range results {
		switch r.outcome {
		case "http":
			classes[fmt.Sprintf("%dxx", r.status/100)]++
			if r.status >= 500 {
				classes[strconv.Itoa(r.status)]++
				if !documented5xx(r.status) {
					badCount++
					if len(bad) < 5 {
						bad = append(bad, fmt.Sprintf("HTTP %d for %s %s", r.status, r.req.area, r.req.desc))
					}
				}
			}
		case "grpc":
			k := "grpc " + r.code.String()
			if r.code == codes.Internal && !grpcServerFault(r.code, r.detail) {
				k += " (undecodable message)"
			}
			classes[k]++
			if grpcServerFault(r.code, r.detail) {
				badCount++
				if len(bad) < 5 {
					bad = append(bad, fmt.Sprintf("gRPC %s for %s: %s", r.code, r.req.desc, r.detail))
				}
			}
		case "timeout":
			if r.req.stream {
				classes["open stream"]++
				continue
			}
			if r.req.incomplete {
				classes["incomplete request, waiting"]++
				continue
			}
			timeouts++
			classes["timeout"]++
			if len(bad) < 5 {
				bad = append(bad, fmt.Sprintf("no answer in 5s to %s %s", r.req.area, r.req.desc))
			}
		case "closed":
			classes["no HTTP/1 answer (h2 frames or closed)"]++
		default:
			classes[r.outcome]++
		}
	}
	if badCount > 0 {
		row.fail(t, "%d answers 5xx (or gRPC INTERNAL/UNKNOWN) other than the documented 502/503/504/507 (and net/http's 505), e.g. %s", badCount, strings.Join(bad, "; "))
	}
	if timeouts > 0 {
		row.fail(t, "%d requests got no answer within 5s: %s", timeouts, strings.Join(bad, "; "))
	}
	if code, _, _, err := p.call(http.MethodGet, "/healthz", nil, ""); err != nil || code != http.StatusOK {
		row.fail(t, "healthz after the fuzz: HTTP %d %v", code, err)
	}
	if l, code, _ := p.get(t, target.GetLease().GetId()); code != http.StatusOK || !isReady(l) {
		row.fail(t, "the proxy's target lease is no longer READY after the fuzz: HTTP %d %s", code, l.GetState())
	}
	panics := panicLines(p)
	if h := procHealth(p); h != "" {
		row.fail(t, "%s", h)
	}
	if n := len(containersWith(t, runtime.LabelInstance+"="+instance)); n > 4 {
		row.fail(t, "%d containers of the instance, max leases 4", n)
	}
	keys := make([]string, 0, len(classes))
	for k := range classes {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, classes[k]))
	}
	row.figures = fmt.Sprintf("panics %d, undocumented 5xx %d, hung %d; %s; answered in p50 %.1fms p99 %.0fms; all in %.1fs",
		panics, badCount, timeouts, strings.Join(parts, ", "), ms(percentile(lat, 50)), ms(percentile(lat, 99)), took.Seconds())
	if os.Getenv("BERTH_CHAOS_FUZZ_DUMP") != "" {
		for i, r := range results {
			fmt.Printf("%d %s %s %d %s %dms %s %s %s\n", i, r.req.area, r.outcome, r.status, r.code, r.took.Milliseconds(), r.req.desc, r.detail, trunc(strconv.Quote(string(r.req.raw)), 300))
		}
	}
}
