// Package files is the sandbox-agent's file service: streamed upload and
// download, stat, list, mkdir, move and remove on the sandbox's real file
// system.
//
// The business logic is FS, which knows nothing of protobuf or HTTP. Two thin
// edges sit on top of it: Server, the gRPC FileService, and HTTPHandler, the
// raw-bytes REST routes PUT and GET /v1/files/{path} (JSON is the wrong
// encoding for large binary files). Errors are errdefs categories wrapped
// with the paths involved; the edges map them to gRPC codes and HTTP
// statuses.
//
// # Uploads
//
// An upload streams into a temporary file named ".berth-upload-*" in the
// target's directory while its SHA-256 is computed, gets its mode, and is
// then renamed (or, when overwriting is not allowed, hard-linked) into
// place. Any failure — the reader's error, a cancelled context, a full disk,
// a hash mismatch — closes and removes the temporary file, so a failed or
// cancelled upload leaves neither the target nor a temporary file behind,
// and a concurrent reader sees either the old file or the complete new one.
//
// Uploads are not fsynced by default: sandboxes are disposable, and the
// rename already protects readers from partial files; the cost of a sync on
// every upload buys durability across a host crash that berth does not
// promise. Set Config.Sync to change that.
//
// # Watches
//
// Watch reports the changes under a directory (package watch: fsnotify,
// recursive, debounced per path, overflow when events are lost) with the
// service's identity, so a watch sees only what the user may read. The
// watches of one FS are bounded together (Config.MaxWatches running at
// once, Config.MaxWatchDirs directories); beyond, ResourceExhausted. The
// gRPC FileService.Watch streams them; grpc-gateway serves it as
// newline-delimited JSON at GET /v1/files:watch.
//
// # Symlinks
//
// Stat, List, Move and Remove act on symlinks themselves (lstat semantics);
// List never descends into a symlinked directory. Download follows symlinks
// (it reads the file a link points to); an upload onto a symlink replaces the
// link with a regular file rather than writing through it.
package files
