package proxy

import (
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"

	"github.com/berth-dev/berth/internal/edge"
	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/lease"
)

// Uploads through the proxy are held to the lease's disk limit
// (lease.Route.DiskLimit): an upload larger than what is left of it is
// refused — REST with 507 Insufficient Storage, gRPC with
// RESOURCE_EXHAUSTED — before or while its body is forwarded. The agent's
// uploads are atomic (a temporary file renamed into place), so an upload cut
// off leaves no partial file. Archive uploads (PUT /v1/archive/..., the
// UploadArchive RPC) are held to the same budget; a gzip-compressed one is
// decompressed here and forwarded as plain tar, so that what is counted is
// what the disk receives.

// StatusInsufficientStorage is the HTTP status of an upload refused for the
// lease's disk limit.
const StatusInsufficientStorage = http.StatusInsufficientStorage // 507

// uploadMethods are the agent's streaming upload RPCs: files and tar
// archives.
var uploadMethods = map[string]bool{
	"/berth.agent.v1.FileService/Upload":        true,
	"/berth.agent.v1.FileService/UploadArchive": true,
}

// filesPrefix and archivePrefix are the agent's raw REST routes; PUT under
// them is an upload (of a file, of a tar archive).
const (
	filesPrefix   = "/v1/files/"
	archivePrefix = "/v1/archive/"
)

// isUpload reports whether a REST request is an upload.
func isUpload(r *http.Request, path string) bool {
	return r.Method == http.MethodPut && (strings.HasPrefix(path, filesPrefix) || strings.HasPrefix(path, archivePrefix)) ||
		isOpenHandsUpload(r, path) // openhands.go
}

// gunzipArchive replaces the body of a gzip-compressed archive upload with
// its decompressed stream (and drops the encoding), so that the budget
// counts the bytes that reach the disk, not the compressed ones. It reports
// false for a body that is not gzip.
func gunzipArchive(r *http.Request, path string) bool {
	enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding")))
	if !strings.HasPrefix(path, archivePrefix) || (enc != "gzip" && enc != "x-gzip") {
		return true
	}
	zr, err := gzip.NewReader(r.Body)
	if err != nil {
		return false
	}
	r.Body = struct {
		io.Reader
		io.Closer
	}{zr, r.Body}
	r.Header.Del("Content-Encoding")
	r.Header.Del("Content-Length")
	r.ContentLength = -1
	return true
}

// diskCharger is implemented by a LeaseRouter that wants to hear of the
// bytes a successful upload wrote (lease.Manager.ChargeDisk).
type diskCharger interface {
	ChargeDisk(id string, n int64)
}

var _ diskCharger = (*lease.Manager)(nil)

func (p *Proxy) chargeDisk(id string, n int64) {
	if c, ok := p.leases.(diskCharger); ok {
		c.ChargeDisk(id, n)
	}
}

// diskLeft is what is left of a lease's disk limit, and whether it has one.
func diskLeft(rt lease.Route) (int64, bool) {
	if rt.DiskLimit <= 0 {
		return 0, false
	}
	return rt.DiskLimit - rt.DiskUsed, true
}

func diskMessage(id string, rt lease.Route, size int64) string {
	used := fmt.Sprintf("%d of %d bytes used", rt.DiskUsed, rt.DiskLimit)
	if rt.DiskUsed >= rt.DiskLimit {
		return fmt.Sprintf("disk limit exceeded: lease %s has %s; uploads are refused", id, used)
	}
	left := rt.DiskLimit - rt.DiskUsed
	if size < 0 {
		return fmt.Sprintf("disk limit exceeded: the upload went past the %d bytes left to lease %s (%s)", left, id, used)
	}
	return fmt.Sprintf("disk limit exceeded: an upload of %d bytes does not fit in the %d bytes left to lease %s (%s)", size, left, id, used)
}

// errDiskBudget ends an upload's body once it passed the lease's budget.
var errDiskBudget = errors.New("upload exceeds the lease's disk limit")

// budgetBody counts an upload's body and fails it once more than left
// bytes were read. Close does not close the client's body, so that the
// rest can be drained before the 507 is sent.
type budgetBody struct {
	body     io.ReadCloser
	left     int64
	n        atomic.Int64
	exceeded atomic.Bool
}

func (b *budgetBody) Read(p []byte) (int, error) {
	if b.exceeded.Load() {
		return 0, errDiskBudget
	}
	n, err := b.body.Read(p)
	if b.n.Add(int64(n)) > b.left {
		b.exceeded.Store(true)
		return 0, errDiskBudget
	}
	return n, err
}

func (b *budgetBody) Close() error { return nil }

// limitUpload applies the disk limit to a REST upload before it is
// forwarded: a declared size over the budget (or no budget left) is
// answered with 507 at once (after draining a bounded amount of the body,
// so that clients that send it all before reading get the answer); else
// the body is counted while it streams (see budgetBody). It reports
// whether the request may go on.
func (p *Proxy) limitUpload(w http.ResponseWriter, r *http.Request, t *target, rt lease.Route) bool {
	left, limited := diskLeft(rt)
	if !limited || !isUpload(r, t.path) {
		return true
	}
	if left > 0 && !gunzipArchive(r, t.path) {
		edge.DrainBody(w, r, true)
		t.status = http.StatusBadRequest
		edge.WriteErrorStatus(w, t.status, errdefs.InvalidArgument("Content-Encoding", "the body is not gzip"))
		return false
	}
	if left <= 0 || r.ContentLength > left {
		p.refuseUpload(w, r, t, diskMessage(t.leaseID, rt, r.ContentLength), false)
		return false
	}
	t.upload = &budgetBody{body: r.Body, left: left}
	t.uploadMsg = diskMessage(t.leaseID, rt, -1)
	r.Body = t.upload
	return true
}

// refuseUpload answers 507 with the JSON error body of the API
// ({"code": 8, "message": "disk limit exceeded: ..."}).
func (p *Proxy) refuseUpload(w http.ResponseWriter, r *http.Request, t *target, msg string, consumed bool) {
	if t.upload != nil {
		r2 := *r
		r2.Body = t.upload.body
		edge.DrainBody(w, &r2, consumed)
	} else {
		edge.DrainBody(w, r, consumed)
	}
	t.status = StatusInsufficientStorage
	p.log.Info("upload refused: disk limit", "lease_id", t.leaseID, "path", t.path, "status", t.status)
	edge.WriteErrorStatus(w, StatusInsufficientStorage, errdefs.Newf(errdefs.ErrResourceExhausted, "%s", msg))
}

// grpcUploadBudget is the byte budget of a gRPC upload through the proxy:
// messages (header and chunks, as sent on the wire) are counted, and the
// call is cut when they pass the budget.
type grpcUploadBudget struct {
	left     int64
	n        atomic.Int64
	exceeded atomic.Bool
	msg      string
}

// limitGRPCUpload returns the budget of an upload call to a lease with a
// disk limit (nil for other calls), or the RESOURCE_EXHAUSTED error when
// nothing is left.
func limitGRPCUpload(method, id string, rt lease.Route) (*grpcUploadBudget, error) {
	left, limited := diskLeft(rt)
	if !limited || !uploadMethods[method] {
		return nil, nil
	}
	if left <= 0 {
		return nil, errdefs.Newf(errdefs.ErrResourceExhausted, "%s", diskMessage(id, rt, 0))
	}
	return &grpcUploadBudget{left: left, msg: diskMessage(id, rt, -1)}, nil
}

// add counts a message of n bytes and reports whether the budget still holds.
func (b *grpcUploadBudget) add(n int) bool {
	if b.n.Add(int64(n)) > b.left {
		b.exceeded.Store(true)
		return false
	}
	return true
}

// sent is how many bytes were counted.
func (b *grpcUploadBudget) sent() int64 { return b.n.Load() }
