package main

import (
	"os"
	"testing"
)

func TestReadSecrets(t *testing.T) {
	t.Setenv("TOKEN", "tok-value")
	t.Setenv("EMPTY", "")
	t.Setenv(secretsEnv, "TOKEN,EMPTY,MISSING,")
	got := readSecrets()
	if len(got) != 2 || got["TOKEN"] != "tok-value" || got["EMPTY"] != "" {
		t.Fatalf("readSecrets = %v", got)
	}
	if _, ok := os.LookupEnv(secretsEnv); ok {
		t.Errorf("%s is still set", secretsEnv)
	}
	if os.Getenv("TOKEN") != "tok-value" {
		t.Error("the secret itself must stay in the environment for commands")
	}
}
