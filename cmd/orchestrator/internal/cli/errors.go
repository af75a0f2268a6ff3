package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"regexp"
	"strings"
	"syscall"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/errdefs/errgrpc"
)

// categories are berth's error categories, named in words in error lines.
var categories = []error{
	errdefs.ErrInvalidArgument, errdefs.ErrNotFound, errdefs.ErrAlreadyExists,
	errdefs.ErrFailedPrecondition, errdefs.ErrUnavailable, errdefs.ErrResourceExhausted,
	errdefs.ErrUnauthenticated, errdefs.ErrPermissionDenied, errdefs.ErrConflict, errdefs.ErrInternal,
}

// otherCodes names the gRPC codes that have no berth category.
var otherCodes = map[codes.Code]string{
	codes.Unimplemented: "not implemented",
	codes.OutOfRange:    "out of range",
	codes.DataLoss:      "data loss",
}

// printError writes err as one line: "orchestrator: MESSAGE (CATEGORY)",
// the message escaped for the terminal, the category in words ("not
// found", "unauthenticated") and left out when there is none.
func printError(w io.Writer, err error) {
	msg := err.Error()
	if st, ok := status.FromError(err); ok {
		msg = st.Message()
	}
	// A status wrapped in an error of ours is spelled "rpc error: code =
	// Unavailable desc = …" inside the message: the category follows in
	// words, the code's name goes.
	msg = grpcPrefix.ReplaceAllString(msg, "")
	cat := category(err)
	for _, c := range categories { // the category is said at the end
		msg = strings.TrimPrefix(msg, c.Error()+": ")
	}
	msg = safe(strings.ReplaceAll(msg, "\n", " "))
	if cat == "" {
		fmt.Fprintf(w, "orchestrator: %s\n", msg)
		return
	}
	fmt.Fprintf(w, "orchestrator: %s (%s)\n", msg, cat)
}

// category names err's category in words: one of berth's categories (from
// the gRPC status or the error chain), a context's end, a local file
// error by its errno (a missing file is "not found", a directory where a
// file was expected "failed precondition", a full disk "resource
// exhausted"), another gRPC code in words, or "" when unknown: never a
// code's Go name such as "Unknown".
func category(err error) string {
	st, isStatus := status.FromError(err)
	if isStatus {
		err = errgrpc.FromGRPC(err)
	}
	for _, c := range categories {
		if errors.Is(err, c) {
			return c.Error()
		}
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline exceeded"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, fs.ErrNotExist):
		return errdefs.ErrNotFound.Error()
	case errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.EROFS):
		return errdefs.ErrPermissionDenied.Error()
	case errors.Is(err, fs.ErrExist):
		return errdefs.ErrAlreadyExists.Error()
	case errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.ENOTEMPTY):
		return errdefs.ErrFailedPrecondition.Error()
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT), errors.Is(err, syscall.EMFILE):
		return errdefs.ErrResourceExhausted.Error()
	case isStatus:
		return otherCodes[st.Code()]
	}
	return ""
}

// grpcPrefix is how a gRPC status error spells its code in a message.
var grpcPrefix = regexp.MustCompile(`rpc error: code = [A-Za-z]+ desc = `)
