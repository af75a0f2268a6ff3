package config

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/berth-dev/berth/pkg/lease"
	"github.com/berth-dev/berth/pkg/orchestrator"
)

// configFields returns the fields of an orchestrator.Config by name, the
// fields of the lease components' configurations it holds (lease.DiskConfig
// …) each on its own ("Disk.Interval"): a setting sets one of them.
func configFields(c orchestrator.Config) map[string]any {
	fields := map[string]any{}
	var walk func(v reflect.Value, prefix string)
	walk = func(v reflect.Value, prefix string) {
		for i := 0; i < v.NumField(); i++ {
			f, name := v.Field(i), prefix+v.Type().Field(i).Name
			if t := f.Type(); t.Kind() == reflect.Struct && t.PkgPath() == reflect.TypeFor[lease.Config]().PkgPath() && strings.HasSuffix(t.Name(), "Config") {
				walk(f, name+".")
				continue
			}
			fields[name] = f.Interface()
		}
	}
	walk(reflect.ValueOf(c), "")
	return fields
}

// noSetting are the fields of the lease components' configurations the
// orchestrator does not expose: they keep the component's default.
var noSetting = map[string]bool{
	"Disk.Concurrency":     true, // two measurements at once
	"Volumes.ReapInterval": true, // a minute, at most half the retention
	"Volumes.HostMounts":   true, // AllowHostMounts (a string) adds to it
	// Set by orchestrator.New from settings of another shape:
	"Admission.DefaultResources": true, // DefaultCPUs (a number of CPUs), DefaultMemoryBytes, …
	"Admission.MaxResources":     true, // MaxCPUs (a number of CPUs), MaxMemoryBytes, …
	"Admission.DenyRootUser":     true, // !AllowRootUser
}

// load runs Load with a fresh data dir (Validate wants one), an optional
// file and env.
func load(t *testing.T, file string, env map[string]string, args ...string) (orchestrator.Config, error) {
	t.Helper()
	full := map[string]string{"BERTH_DATA_DIR": t.TempDir()}
	for k, v := range env {
		full[k] = v
	}
	if file != "" {
		p := filepath.Join(t.TempDir(), "berth.json")
		if err := os.WriteFile(p, []byte(file), 0o600); err != nil {
			t.Fatal(err)
		}
		full[EnvConfigFile] = p
	}
	return Load(args, func(k string) string { return full[k] })
}

// TestPrecedence checks default < file < env < flag for settings of every
// kind, including a flag that repeats the default over the environment.
func TestPrecedence(t *testing.T) {
	type layer struct{ file, env, flag string }
	for _, c := range []struct {
		flag, env, key string
		get            func(orchestrator.Config) any
		def            any
		file, envVal   string // the file's JSON value, the variable's text
		fileWant       any
		envWant        any
		flagVal        string
		flagWant       any
		defText        string // the default written as a flag value
	}{
		{"listen", "BERTH_LISTEN", "listen", func(c orchestrator.Config) any { return c.Listen }, "127.0.0.1:7070",
			`"127.0.0.1:1"`, "127.0.0.1:2", "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:3", "127.0.0.1:7070"},
		{"log-format", "BERTH_LOG_FORMAT", "logFormat", func(c orchestrator.Config) any { return c.LogFormat }, "text",
			`"json"`, "json", "json", "json", "json", "json", "text"},
		{"max-leases", "BERTH_MAX_LEASES", "maxLeases", func(c orchestrator.Config) any { return c.Admission.MaxLive }, 100,
			`7`, "8", 7, 8, "9", 9, "100"},
		{"restart-limit", "BERTH_RESTART_LIMIT", "restartLimit", func(c orchestrator.Config) any { return c.Restart.Limit }, 3,
			`1`, "2", 1, 2, "0", 0, "3"},
		{"max-pids", "BERTH_MAX_PIDS", "maxPids", func(c orchestrator.Config) any { return c.MaxPids }, int64(4096),
			`1000`, "2000", int64(1000), int64(2000), "3000", int64(3000), "4096"},
		{"userns-base", "BERTH_USERNS_BASE", "userNSBase", func(c orchestrator.Config) any { return c.UserNSBase }, uint32(0),
			`65536`, "131072", uint32(65536), uint32(131072), "196608", uint32(196608), "0"},
		{"default-memory-bytes", "BERTH_DEFAULT_MEMORY_BYTES", "defaultMemoryBytes", func(c orchestrator.Config) any { return c.DefaultMemoryBytes }, int64(512 << 20),
			`268435456`, "1Gi", int64(256 << 20), int64(1 << 30), "2G", int64(2e9), "536870912"},
		{"max-env-bytes", "BERTH_MAX_ENV_BYTES", "maxEnvBytes", func(c orchestrator.Config) any { return c.Admission.MaxEnvBytes }, 64 << 10,
			`"1Ki"`, "2048", 1024, 2048, "3Ki", 3 << 10, "64Ki"},
		{"default-cpus", "BERTH_DEFAULT_CPUS", "defaultCPUs", func(c orchestrator.Config) any { return c.DefaultCPUs }, 1.0,
			`0.5`, "2", 0.5, 2.0, "250m", 0.25, "1"},
		{"max-ttl", "BERTH_MAX_TTL", "maxTTL", func(c orchestrator.Config) any { return time.Duration(c.MaxTTL) }, 24 * time.Hour,
			`"1h"`, "2h", time.Hour, 2 * time.Hour, "90m", 90 * time.Minute, "24h"},
		{"retention", "BERTH_RETENTION", "retention", func(c orchestrator.Config) any { return time.Duration(c.Retention) }, time.Hour,
			`"5m"`, "10m", 5 * time.Minute, 10 * time.Minute, "15m", 15 * time.Minute, "1h"},
		{"allow-root-user", "BERTH_ALLOW_ROOT_USER", "allowRootUser", func(c orchestrator.Config) any { return c.AllowRootUser }, true,
			`false`, "true", false, true, "false", false, "true"},
		{"userns", "BERTH_USERNS", "userNamespaces", func(c orchestrator.Config) any { return c.UserNamespaces }, false,
			`true`, "0", true, false, "true", true, "false"},
		{"allowed-images", "BERTH_ALLOWED_IMAGES", "allowedImages", func(c orchestrator.Config) any { return strings.Join(c.Admission.AllowedImages, "|") }, "berth/",
			`["a/", "b"]`, "c, d ,", "a/|b", "c|d", "*", "*", "berth/"},
		{"default-user-images", "BERTH_DEFAULT_USER_IMAGES", "defaultUserImages", func(c orchestrator.Config) any { return strings.Join(c.Admission.DefaultUserImages, "|") }, "berth/",
			`["x/"]`, "y/", "x/", "y/", "z/", "z/", "berth/"},
	} {
		t.Run(c.flag, func(t *testing.T) {
			for _, l := range []struct {
				name string
				layer
				want any
			}{
				{"default", layer{}, c.def},
				{"file", layer{file: c.file}, c.fileWant},
				{"env over file", layer{file: c.file, env: c.envVal}, c.envWant},
				{"flag over env and file", layer{file: c.file, env: c.envVal, flag: c.flagVal}, c.flagWant},
				{"flag with the default over env and file", layer{file: c.file, env: c.envVal, flag: c.defText}, c.def},
			} {
				file := ""
				if l.file != "" {
					file = fmt.Sprintf(`{%q: %s}`, c.key, l.file)
				}
				env := map[string]string{}
				if l.env != "" {
					env[c.env] = l.env
				}
				var args []string
				if l.flag != "" {
					args = []string{"--" + c.flag + "=" + l.flag}
				}
				cfg, err := load(t, file, env, args...)
				if err != nil {
					t.Fatalf("%s: %v", l.name, err)
				}
				if got := c.get(cfg); got != l.want {
					t.Errorf("%s: got %v (%T), want %v (%T)", l.name, got, got, l.want, l.want)
				}
			}
		})
	}
}

// TestEverySettingAllWays checks that the table covers every field of
// orchestrator.Config once, that every setting has a variable, a flag
// (except the secrets) and a file key (except the operator token), that no
// name repeats, and that the names scripts use still exist.
func TestEverySettingAllWays(t *testing.T) {
	sample := map[string]string{"string": "x", "int": "7", "bytes": "7", "cpus": "7", "duration": "7s", "list": "a,b",
		"clients": "o:tokentokentoken1", "pool": "name=p,max=1", "pairs": "a=b"}
	covered := map[string]string{}
	names := map[string]bool{}
	for _, s := range settings {
		for _, n := range []string{"--" + s.Flag, s.Env, "key " + s.Key} {
			if n != "--" && n != "key " && names[n] {
				t.Errorf("%s is used twice", n)
			}
			names[n] = true
		}
		if !strings.HasPrefix(s.Env, "BERTH_") || s.Usage == "" || s.Group == "" {
			t.Errorf("%s: env, usage and group required", s.Env)
		}
		secret := s.Group == groupSecrets
		if (s.Flag == "") != secret || (s.Key == "" && s.Env != "BERTH_OPERATOR_TOKEN") {
			t.Errorf("%s: flag %q key %q", s.Env, s.Flag, s.Key)
		}
		var before orchestrator.Config
		after := before
		v := s.field(&after)
		text, ok := sample[v.Type()]
		if !ok { // booleans
			text = "true"
		}
		if err := v.Set(text); err != nil {
			t.Fatalf("%s: set %q: %v", s.Env, text, err)
		}
		bf, af := configFields(before), configFields(after)
		var changed []string
		for name, b := range bf {
			if !reflect.DeepEqual(b, af[name]) {
				changed = append(changed, name)
			}
		}
		if len(changed) != 1 {
			t.Errorf("%s sets fields %v, want one", s.Env, changed)
			continue
		}
		if prev, dup := covered[changed[0]]; dup {
			t.Errorf("field %s is set by %s and %s", changed[0], prev, s.Env)
		}
		covered[changed[0]] = s.Env
	}
	for name := range configFields(orchestrator.Config{}) {
		if _, ok := covered[name]; !ok && !noSetting[name] {
			t.Errorf("Config.%s has no setting", name)
		}
	}
	// The names before the table: scripts depend on them.
	for _, n := range []string{
		"--listen", "--data-dir", "--runtime", "--containerd-address", "--containerd-namespace", "--agent-binary",
		"--agent-injection", "--preview-domain", "--default-image", "--max-leases", "--default-ttl", "--default-idle-timeout",
		"--restart-limit", "--restart-window", "--max-leases-per-owner", "--max-cpus", "--max-memory-bytes", "--max-pids",
		"--max-disk-bytes", "--max-env-bytes", "--max-labels", "--max-public-ports", "--max-ended-per-owner",
		"--max-watches-per-principal", "--max-connections", "--allowed-images", "--default-disk-bytes", "--disk-interval",
		"--disk-grace", "--default-user", "--allow-root-user", "--userns", "--host-input", "--log-level", "--log-format",
		"BERTH_LISTEN", "BERTH_DATA_DIR", "BERTH_RUNTIME", "BERTH_CONTAINERD_ADDRESS", "BERTH_CONTAINERD_NAMESPACE",
		"BERTH_CONTAINERD_STATE_DIR", "BERTH_CNI_BIN_DIR", "BERTH_SANDBOX_SUBNET", "BERTH_SANDBOX_BRIDGE", "BERTH_AGENT_BINARY",
		"BERTH_AGENT_INJECTION", "BERTH_DEFAULT_IMAGE", "BERTH_PREVIEW_DOMAIN", "BERTH_LOG_LEVEL", "BERTH_LOG_FORMAT",
		"BERTH_DEFAULT_TTL", "BERTH_DEFAULT_IDLE_TIMEOUT", "BERTH_MAX_LEASES", "BERTH_MAX_LEASES_PER_OWNER", "BERTH_MAX_ENV_BYTES",
		"BERTH_MAX_LABELS", "BERTH_MAX_PUBLIC_PORTS", "BERTH_MAX_ENDED_PER_OWNER", "BERTH_MAX_WATCHES_PER_PRINCIPAL",
		"BERTH_MAX_CONNECTIONS", "BERTH_RESTART_LIMIT", "BERTH_RESTART_WINDOW", "BERTH_MAX_MEMORY_BYTES", "BERTH_MAX_PIDS",
		"BERTH_DEFAULT_DISK_BYTES", "BERTH_DISK_INTERVAL", "BERTH_DISK_GRACE", "BERTH_MAX_DISK_BYTES", "BERTH_MAX_CPUS",
		"BERTH_ALLOWED_IMAGES", "BERTH_DEFAULT_USER", "BERTH_HOST_INPUT", "BERTH_USERNS", "BERTH_USERNS_BASE",
		"BERTH_ALLOW_ROOT_USER", "BERTH_OPERATOR_TOKEN", "BERTH_CLIENT_TOKENS",
		"key listen", "key dataDir", "key runtime", "key containerdAddress", "key containerdNamespace", "key containerdStateDir",
		"key cniBinDir", "key sandboxSubnet", "key sandboxBridge", "key userNamespaces", "key userNSBase", "key agentBinary",
		"key previewDomain", "key network", "key agentInjection", "key defaultImage", "key defaultTTL", "key maxTTL",
		"key defaultIdleTimeout", "key maxLeases", "key retention", "key restartLimit", "key restartWindow", "key defaultCPUs",
		"key defaultMemoryBytes", "key defaultPids", "key defaultDiskBytes", "key diskInterval", "key diskGrace", "key maxCPUs",
		"key maxMemoryBytes", "key maxPids", "key maxDiskBytes", "key maxEnvBytes", "key maxLabels", "key maxPublicPorts",
		"key allowedImages", "key defaultUser", "key defaultUserImages", "key allowRootUser", "key hostInput",
		"key maxLeasesPerOwner", "key maxEndedPerOwner", "key maxWatchesPerPrincipal", "key maxConnections",
		"key readHeaderTimeout", "key idleTimeout", "key clients", "key logLevel", "key logFormat",
	} {
		if !names[n] {
			t.Errorf("%s is gone", n)
		}
	}
}

// TestErrors checks that a bad value names its source and its setting.
func TestErrors(t *testing.T) {
	for _, c := range []struct {
		name string
		file string
		env  map[string]string
		args []string
		want []string
	}{
		{name: "env int", env: map[string]string{"BERTH_MAX_PIDS": "x"}, want: []string{`BERTH_MAX_PIDS: "x" is not an integer`}},
		{name: "env size", env: map[string]string{"BERTH_MAX_DISK_BYTES": "lots"}, want: []string{`BERTH_MAX_DISK_BYTES: "lots" is not a size`}},
		{name: "env duration", env: map[string]string{"BERTH_DEFAULT_TTL": "soon"}, want: []string{`BERTH_DEFAULT_TTL: "soon" is not a duration`}},
		{name: "env bool", env: map[string]string{"BERTH_USERNS": "yes"}, want: []string{`BERTH_USERNS: "yes" is not true or false`}},
		{name: "env cpus", env: map[string]string{"BERTH_MAX_CPUS": "many"}, want: []string{`BERTH_MAX_CPUS: "many" is not a number of CPUs`}},
		{name: "env range", env: map[string]string{"BERTH_USERNS_BASE": "-1"}, want: []string{`BERTH_USERNS_BASE: "-1" is out of range`}},
		{name: "env clients", env: map[string]string{"BERTH_CLIENT_TOKENS": "nocolon"}, want: []string{"BERTH_CLIENT_TOKENS: want owner:token"}},
		{name: "every bad variable", env: map[string]string{"BERTH_MAX_PIDS": "x", "BERTH_MAX_LEASES": "y"},
			want: []string{"BERTH_MAX_PIDS", "BERTH_MAX_LEASES"}},
		{name: "flag", args: []string{"--max-pids", "x"}, want: []string{`"--max-pids"`, `"x" is not an integer`}},
		{name: "flag bool", args: []string{"--allow-root-user", "maybe"}, want: []string{`"--allow-root-user"`, "not true or false"}},
		{name: "unknown flag", args: []string{"--no-such-flag"}, want: []string{"no-such-flag"}},
		{name: "argument", args: []string{"extra"}, want: []string{`unexpected arguments ["extra"]`}},
		{name: "file int", file: `{"maxPids": "x"}`, want: []string{"config file", `maxPids: want a number, got "x"`}},
		{name: "file size", file: `{"maxDiskBytes": "lots"}`, want: []string{"config file", `maxDiskBytes: "lots" is not a size`}},
		{name: "file type", file: `{"listen": 7}`, want: []string{"config file", "listen:"}},
		{name: "file duration", file: `{"maxTTL": 5}`, want: []string{"config file", "maxTTL: want a string duration"}},
		{name: "file unknown key", file: `{"maxPid": 1}`, want: []string{"config file", `unknown key "maxPid"`}},
		{name: "file unknown client key", file: `{"clients": [{"owner": "o", "token": "t", "x": 1}]}`, want: []string{"clients:", `unknown field "x"`}},
		{name: "file not an object", file: `[1]`, want: []string{"config file", "want a JSON object"}},
		{name: "file missing", env: map[string]string{EnvConfigFile: "/nonexistent/berth.json"}, want: []string{"config file:", "no such file"}},
		{name: "invalid", env: map[string]string{"BERTH_RUNTIME": "podman"}, want: []string{`runtime "podman" is not supported`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := load(t, c.file, c.env, c.args...)
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

// TestCompat checks forms that existed before the table.
func TestCompat(t *testing.T) {
	c, err := load(t, `{"defaultUser": "image", "CLIENTS": [{"owner": "f", "token": "file-token-0123456789"}]}`,
		map[string]string{"BERTH_CLIENT_TOKENS": "e:env-token-0123456789", "BERTH_USERNS": "1"},
		"--allow-root-user", "false")
	if err != nil {
		t.Fatal(err)
	}
	if c.Admission.DefaultUser != "" || c.AllowRootUser || !c.UserNamespaces || len(c.Clients) != 2 || c.Clients[0].Owner != "f" || c.Clients[1].Owner != "e" {
		t.Errorf("got user %q root %v userns %v clients %v", c.Admission.DefaultUser, c.AllowRootUser, c.UserNamespaces, c.Clients)
	}
	c, err = load(t, "null", map[string]string{"BERTH_DEFAULT_USER": "nobody", "BERTH_OPERATOR_TOKEN": "op"}, "--userns", "--default-user", "image")
	if err != nil || c.Admission.DefaultUser != "" || !c.UserNamespaces || c.OperatorToken != "op" {
		t.Errorf("bare --userns, --default-user image: %v %q %v %q", err, c.Admission.DefaultUser, c.UserNamespaces, c.OperatorToken)
	}
	// An empty flag or variable is not given: the next source down applies.
	c, err = load(t, `{"listen": "127.0.0.1:1", "maxPids": 999}`, map[string]string{"BERTH_LISTEN": "", "BERTH_MAX_PIDS": ""},
		"--listen", "", "--max-pids=", "--allow-root-user", "")
	if err != nil || c.Listen != "127.0.0.1:1" || c.MaxPids != 999 || !c.AllowRootUser {
		t.Errorf("empty flags and variables: %v %q %d %v", err, c.Listen, c.MaxPids, c.AllowRootUser)
	}
	// --config wins over BERTH_CONFIG; an integer with a base prefix is read as Go's flag package did.
	p := filepath.Join(t.TempDir(), "other.json")
	if err := os.WriteFile(p, []byte(`{"maxLabels": 5}`), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err = load(t, `{"maxLabels": 9}`, nil, "--config", p, "--max-public-ports", "0x10")
	if err != nil || c.Admission.MaxLabels != 5 || c.Admission.MaxPublicPorts != 16 {
		t.Errorf("--config: %v labels %d ports %d", err, c.Admission.MaxLabels, c.Admission.MaxPublicPorts)
	}
}

// TestDiskConfig is the configuration half of the disk limit's tests
// (pkg/orchestrator keeps the API half).
func TestDiskConfig(t *testing.T) {
	cfg, err := load(t, "", map[string]string{"BERTH_DEFAULT_DISK_BYTES": "0", "BERTH_DISK_INTERVAL": "2s", "BERTH_DISK_GRACE": "1m"})
	if err != nil || cfg.DefaultDiskBytes != 0 || cfg.Disk.Interval != 2*time.Second || cfg.Disk.Grace != time.Minute {
		t.Fatalf("env: %v disk %d interval %s grace %s", err, cfg.DefaultDiskBytes, cfg.Disk.Interval, cfg.Disk.Grace)
	}
	// Flags win; 0 is a value (no limit), not "unset".
	cfg, err = load(t, "", map[string]string{"BERTH_DEFAULT_DISK_BYTES": "1073741824"}, "--default-disk-bytes", "0", "--disk-grace", "5s")
	if err != nil || cfg.DefaultDiskBytes != 0 || cfg.Disk.Grace != 5*time.Second {
		t.Fatalf("flags: %v disk %d grace %s", err, cfg.DefaultDiskBytes, cfg.Disk.Grace)
	}
	cfg, err = load(t, `{"maxDiskBytes": "200Gi"}`, map[string]string{"BERTH_DEFAULT_DISK_BYTES": "10Gi"})
	if err != nil || cfg.DefaultDiskBytes != 10<<30 || cfg.MaxDiskBytes != 200<<30 {
		t.Fatalf("quantities: %v disk %d max %d", err, cfg.DefaultDiskBytes, cfg.MaxDiskBytes)
	}
	for name, c := range map[string]struct {
		args []string
		env  map[string]string
	}{
		"negative":          {env: map[string]string{"BERTH_DEFAULT_DISK_BYTES": "-5"}},
		"below 1 MiB":       {args: []string{"--default-disk-bytes", "1000"}},
		"above the maximum": {env: map[string]string{"BERTH_DEFAULT_DISK_BYTES": "2000000000", "BERTH_MAX_DISK_BYTES": "1000000000"}},
		"zero interval":     {env: map[string]string{"BERTH_DISK_INTERVAL": "0s"}},
	} {
		if _, err := load(t, "", c.env, c.args...); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestLimitsConfig is the configuration half of the limits' tests.
func TestLimitsConfig(t *testing.T) {
	env := map[string]string{
		"BERTH_MAX_CPUS": "8", "BERTH_MAX_MEMORY_BYTES": "1073741824", "BERTH_MAX_PIDS": "100", "BERTH_MAX_ENV_BYTES": "1024",
		"BERTH_ALLOWED_IMAGES": "berth/, debian ,", "BERTH_MAX_LEASES_PER_OWNER": "3", "BERTH_MAX_WATCHES_PER_PRINCIPAL": "2",
	}
	cfg, err := load(t, "", env, "--max-pids", "600", "--max-connections", "50")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MaxCPUs != 8 || cfg.MaxMemoryBytes != 1<<30 || cfg.MaxPids != 600 || cfg.Admission.MaxEnvBytes != 1024 || cfg.Admission.MaxLivePerOwner != 3 ||
		cfg.MaxWatchesPerPrincipal != 2 || cfg.MaxConnections != 50 || strings.Join(cfg.Admission.AllowedImages, "|") != "berth/|debian" {
		t.Fatalf("config: %+v", cfg)
	}
	for name, bad := range map[string]map[string]string{
		"default above max": {"BERTH_MAX_CPUS": "0.5"},
		"nan":               {"BERTH_MAX_CPUS": "NaN"},
		"negative":          {"BERTH_MAX_LEASES_PER_OWNER": "-1"},
		"not a number":      {"BERTH_MAX_PIDS": "many"},
	} {
		if _, err := load(t, "", bad); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestFlagUsages checks --help's listing: every flag under its group with
// its variable and default, and the secrets by variable.
func TestFlagUsages(t *testing.T) {
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	AddFlags(fs)
	fs.Bool("help", false, "help for serve")
	out := FlagUsages(fs)
	for _, want := range []string{
		"Server flags:\n", "Runtime flags:\n", "Leases flags:\n", "Sandbox resources flags:\n", "Other flags:\n",
		"--max-pids int", "(env BERTH_MAX_PIDS) (default 4096)", "--max-memory-bytes bytes", "(default 8Gi)",
		"--allow-root-user true|false", "--userns ", "--max-ttl duration", "(default 24h)", `(default "127.0.0.1:7070")`,
		"BERTH_OPERATOR_TOKEN", "BERTH_CLIENT_TOKENS",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("usage lacks %q:\n%s", want, out)
		}
	}
	if strings.Index(out, "--listen") > strings.Index(out, "--runtime") || strings.Index(out, "--runtime") > strings.Index(out, "--max-ttl") {
		t.Errorf("groups out of order:\n%s", out)
	}
}

// TestDocs checks that docs/configuration.md names every setting.
func TestDocs(t *testing.T) {
	b, err := os.ReadFile("../../../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	for _, s := range settings {
		for _, n := range []string{"--" + s.Flag, s.Env, s.Key} {
			if n != "--" && n != "" && !strings.Contains(doc, "`"+n+"`") {
				t.Errorf("docs/configuration.md does not name `%s`", n)
			}
		}
	}
}

// TestE2BTemplates: --e2b-template adds up, repeated or comma-separated,
// over the variable's; the file takes an object; a pair without an image
// is refused.
func TestE2BTemplates(t *testing.T) {
	cfg, err := load(t, "", map[string]string{"BERTH_E2B_TEMPLATES": "a=img/a"},
		"--e2b-template", "b=img/b", "--e2b-template=c=img/c,d=img/d")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"a": "img/a", "b": "img/b", "c": "img/c", "d": "img/d"}
	if !maps.Equal(cfg.E2BTemplates, want) {
		t.Fatalf("templates %v, want %v", cfg.E2BTemplates, want)
	}
	cfg, err = load(t, `{"e2bTemplates": {"py": "python:3.12"}}`, nil)
	if err != nil || !maps.Equal(cfg.E2BTemplates, map[string]string{"py": "python:3.12"}) {
		t.Fatalf("file: %v %v", cfg.E2BTemplates, err)
	}
	if _, err := load(t, "", nil, "--e2b-template", "x="); err == nil || !strings.Contains(err.Error(), "NAME=VALUE") {
		t.Fatalf("a pair without an image: %v", err)
	}
}
