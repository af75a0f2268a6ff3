package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strings"

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
	cat := category(err)
	msg = strings.TrimPrefix(msg, cat+": ")
	msg = safe(strings.ReplaceAll(msg, "\n", " "))
	if cat == "" {
		fmt.Fprintf(w, "orchestrator: %s\n", msg)
		return
	}
	fmt.Fprintf(w, "orchestrator: %s (%s)\n", msg, cat)
}

// category names err's category in words: one of berth's categories (from
// the gRPC status or the error chain), a context's end, a local file
// error, another gRPC code in words, or "" when unknown.
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
	case errors.Is(err, fs.ErrPermission):
		return errdefs.ErrPermissionDenied.Error()
	case isStatus:
		return otherCodes[st.Code()]
	}
	return ""
}
