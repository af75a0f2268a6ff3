package openhands

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"testing"
)

// TestEmptyListsAreArrays reads the raw JSON of every answer of this
// surface that holds a list, in the states where the list is empty: a
// client in another language iterates it, and Python's json turns null
// into None, which is not iterable (the SDK's first poll of a command that
// has no output yet). Go's decoder cannot see the difference, so the bytes
// are checked.
func TestEmptyListsAreArrays(t *testing.T) {
	srv, dir := newTestServer(t, nil)
	raw := func(path string) []byte {
		t.Helper()
		res, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		if res.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, res.StatusCode, b)
		}
		return b
	}
	field := func(path, name string) {
		t.Helper()
		var m map[string]json.RawMessage
		b := raw(path)
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("GET %s: %v: %s", path, err, b)
		}
		if !bytes.HasPrefix(m[name], []byte("[")) {
			t.Errorf("GET %s: %q is %s, want a JSON array: %s", path, name, m[name], b)
		}
	}
	whole := func(path string) {
		t.Helper()
		if b := bytes.TrimSpace(raw(path)); !bytes.HasPrefix(b, []byte("[")) {
			t.Errorf("GET %s: %s, want a JSON array", path, b)
		}
	}
	field("/api/bash/bash_events/search", "items")
	// A started command with no output yet, as the SDK polls it.
	var started struct{ ID string }
	postJSON(t, srv.URL+"/api/bash/start_bash_command", map[string]any{"command": "sleep 2"}, http.StatusOK, &started)
	q := url.Values{"command_id__eq": {started.ID}, "kind__eq": {"BashOutput"}, "order__gt": {"-1"}, "sort_order": {"TIMESTAMP"}}
	field("/api/bash/bash_events/search?"+q.Encode(), "items")
	q.Set("command_id__eq", "0123456789abcdef0123456789abcdef")
	field("/api/bash/bash_events/search?"+q.Encode(), "items")
	whole("/api/bash/bash_events/")
	whole("/api/git/changes?path=" + url.QueryEscape(dir))
	var info map[string]json.RawMessage
	if err := json.Unmarshal(raw("/server_info"), &info); err != nil {
		t.Fatal(err)
	}
	for k, v := range info {
		if string(v) == "null" && (k == "usable_tools" || k == "capabilities") {
			t.Errorf("server_info %s is null", k)
		}
	}
}
