package orchestrator_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"testing"
	"time"
)

// TestSecretsShowOnlyNames: a lease acquired with secrets shows their names
// and never their values in acquire, get, list and watch.
func TestSecretsShowOnlyNames(t *testing.T) {
	s := start(t, nil)
	const val = "sk-orchestrator-secret-987"

	// Watch from before the acquire.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", s.base+"/v1/leases:watch", nil)
	req.Header.Set("Authorization", "Bearer "+opToken)
	watched := make(chan []byte, 1)
	go func() { // the headers come with the first event
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			watched <- []byte(err.Error())
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		watched <- b
	}()
	time.Sleep(200 * time.Millisecond)

	r := s.do(t, opToken, "POST", "/v1/leases", `{"conversationId":"sec","ttl":"600s","env":{"PLAIN":"p"},"secrets":{"TOKEN":"`+val+`"}}`)
	if r.code != 200 {
		t.Fatalf("acquire: %d %s", r.code, r.body)
	}
	l := r.json(t)["lease"].(map[string]any)
	id := l["id"].(string)
	check := func(what string, b []byte) {
		t.Helper()
		if bytes.Contains(b, []byte(val)) {
			t.Errorf("%s shows the secret's value: %s", what, b)
		}
		if !bytes.Contains(b, []byte(`"secretNames":["TOKEN"]`)) {
			t.Errorf("%s does not name the secret: %s", what, b)
		}
	}
	check("acquire", r.body)
	check("get", s.do(t, opToken, "GET", "/v1/leases/"+id, "").body)
	check("list", s.do(t, opToken, "GET", "/v1/leases", "").body)
	time.Sleep(500 * time.Millisecond)
	cancel()
	check("watch", <-watched)

	// Bad names are refused naming the field.
	r = s.do(t, opToken, "POST", "/v1/leases", `{"conversationId":"sec2","secrets":{"BERTH_X":"`+val+`"}}`)
	if r.code != 400 || !bytes.Contains(r.body, []byte("secrets.BERTH_X")) || bytes.Contains(r.body, []byte(val)) {
		t.Errorf("reserved secret name: %d %s", r.code, r.body)
	}
}
