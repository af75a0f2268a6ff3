package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// newSignCommand is `orchestrator lease sign`.
func newSignCommand(env Env, lf *leaseFlags) *cobra.Command {
	var (
		port             int
		download, upload string
		method           string
		expires          time.Duration
	)
	cmd := &cobra.Command{
		Use:   "sign LEASE (--port PORT | --download PATH | --upload PATH) [--expires D]",
		Short: "Print a signed URL for a preview port, a download or an upload",
		Long: `Print a URL that opens one preview port of a lease, or downloads or uploads
one file, without any other credential: share a running app with a browser,
or hand a build artifact to a person. It is signed for that lease, port or
path, and method, and stops working when it expires (--expires, default 1h,
at most 168h) or when the lease ends. Paths are absolute paths in the
sandbox. Anyone holding the URL has its access until then: treat it like a
short-lived password.

With -o table (the default) only the URL is printed, so that
URL=$(orchestrator lease sign ...) works; -o json prints url, path,
expiresAt and method.`,
		Example: `  orchestrator lease sign LEASE --port 8080
  orchestrator lease sign LEASE --port 8080 --method GET --expires 15m
  curl -fsSL "$(orchestrator lease sign LEASE --download /workspace/dist/app.tar.gz)" -o app.tar.gz
  curl -fsS -T report.txt "$(orchestrator lease sign LEASE --upload /workspace/in/report.txt)"
  orchestrator lease sign LEASE --port 3000 -o json | jq -r .url`,
		Args:              exactArgs(1, "one lease id"),
		ValidArgsFunction: completeLeaseIDs(lf),
		RunE: func(cmd *cobra.Command, args []string) error {
			n := 0
			for _, set := range []bool{port != 0, download != "", upload != ""} {
				if set {
					n++
				}
			}
			if n != 1 {
				return usagef("give exactly one of --port, --download and --upload")
			}
			if expires < 0 {
				return usagef("--expires must not be negative")
			}
			req := &orchv1.SignRequest{Id: args[0], Port: int32(port), Download: download, Upload: upload, Method: method}
			if expires > 0 {
				req.Expires = durationpb.New(expires)
			}
			conn, err := lf.dial()
			if err != nil {
				return err
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), time.Minute)
			defer cancel()
			resp, err := orchv1.NewLeaseServiceClient(conn).Sign(withToken(ctx, lf.bearer()), req)
			if err != nil {
				return fail(err)
			}
			if lf.output == outJSON || lf.output == outYAML {
				return fail(printMessage(env.Stdout, lf.output, resp))
			}
			_, err = fmt.Fprintln(env.Stdout, safe(resp.GetUrl()))
			return err
		},
	}
	fs := cmd.Flags()
	fs.IntVar(&port, "port", 0, "preview port to open (any path under it)")
	fs.StringVar(&download, "download", "", "absolute path of a file to download (GET)")
	fs.StringVar(&upload, "upload", "", "absolute path of a file to upload (PUT)")
	fs.StringVar(&method, "method", "", "with --port: the one HTTP method allowed (GET also allows HEAD); default any")
	fs.DurationVar(&expires, "expires", 0, "how long the URL works (default 1h, at most 168h)")
	return cmd
}
