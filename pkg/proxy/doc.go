// Package proxy routes a caller to its lease's sandbox: the agent's REST API
// by path, the agent's gRPC API by metadata (or authority), and ports that
// programs in the sandbox open ("preview ports") by host or by path.
//
// # Routes
//
//	/v1/sandboxes/{lease}/{agent path}           → http://ENDPOINT/{agent path}
//	/v1/sandboxes/{lease}/ports/{port}/{path}    → http://ENDPOINT_HOST:{port}/{path}
//	Host: {port}-{lease}.{Domain}, any path       → http://ENDPOINT_HOST:{port}/{path}
//	Host: {lease}.{Domain}, any path              → http://ENDPOINT/{path} (agent API)
//	gRPC with metadata x-berth-lease: {lease}     → the agent's gRPC, same method
//	gRPC with :authority {lease}.{Domain}         → the agent's gRPC, same method
//	/v1/signed/{lease}/ports/{port}/{path}?berth_exp=&berth_sig=  → a preview port, signed (signed.go)
//	/v1/signed/{lease}/files/{path}?berth_exp=&berth_sig=          → one file's download (GET) or upload (PUT), signed
//
// Proxy.ServeHTTP serves the HTTP routes (mount it at /v1/sandboxes/ and
// /v1/signed/, and
// wrap the root handler with Proxy.HostRouter for the host forms);
// Proxy.GRPCHandler is a grpc.UnknownServiceHandler that forwards gRPC
// frames without decoding them, given a server built with
// grpc.ForceServerCodecV2(Proxy.Codec()).
//
// # Authentication
//
// The agent API routes accept the lease's token as "Authorization: Bearer
// TOKEN" or "X-Berth-Token: TOKEN" (gRPC: metadata authorization or
// x-berth-token); a WebSocket upgrade may instead offer it as the
// subprotocol "berth.token.TOKEN" (browsers cannot set headers on a
// WebSocket), which is removed before forwarding and is refused when the
// upgrade's Origin is a page of another host. Preview ports also accept a
// berth_token cookie and, to bootstrap a browser, a ?berth_token=TOKEN
// query parameter: a GET with it
// sets an HttpOnly, SameSite=Lax cookie scoped to that preview host (or path
// prefix) and redirects to the same URL without the parameter, always to a
// path on the same host: leading slashes, backslashes and white space (raw
// or percent-encoded) collapse into one '/', so "//evil.example/x" redirects
// to "/evil.example/x". The token cookie is read and stripped by one
// function (net/http's cookie parsing, names trimmed: "berth_token =T"
// counts), so a token the proxy accepts never reaches the app. Ports listed
// in the lease's PublicPorts need no token. The operator token opens every
// lease, and every such access is logged. The caller's token is stripped
// before forwarding; agent API requests carry the agent's own token
// instead, preview requests carry none. Cookies are not accepted on agent
// API routes, so a page cannot drive a sandbox with a visitor's cookie.
//
// Path-form previews share the orchestrator's origin, so a page served by
// one sandbox can read responses of another preview the same browser holds
// a cookie for; host-form previews (one origin per lease and port) do not
// have that problem and are preferred for anything browser-facing.
//
// # Errors
//
// Errors never reach the agent and are never retried blindly: 401 missing,
// invalid or another lease's token; 404 unknown lease; 409 lease PENDING or
// RELEASING; 410 lease RELEASED, EXPIRED or FAILED (the body says which and
// why); 502 agent or port unreachable; 504 upstream timeout; 499 the client
// went away (the upstream request is cancelled, so the agent kills the
// command). Agent API routes answer {"code", "message", "details"} JSON as
// grpc-gateway does; previews answer plain text. gRPC calls get the matching
// codes: UNAUTHENTICATED, NOT_FOUND, UNAVAILABLE (pending, unreachable),
// FAILED_PRECONDITION (releasing, ended), DEADLINE_EXCEEDED, CANCELED.
//
// # Activity
//
// Every proxied request or call touches its lease (postponing the idle
// timeout), and long-lived ones (exec streams, log follows, WebSockets, gRPC
// streams) keep touching it every Config.TouchInterval while they are open.
// With a LeaseRouter that is a Holder (lease.Manager), a request also holds
// its lease from the resume until the agent answered, so a racing pause
// waits for it or is resumed after (the caller sees latency, not 409 or
// 502), and the idle policy leaves a lease with a request in flight alone.
package proxy
