package validate

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"sigs.k8s.io/yaml"
)

const composeFile = "docker-compose.yml"

// loadCompose loads docker-compose.yml the way `docker compose --profile ...`
// does (interpolation, merge keys, normalization, consistency checks), with
// an empty environment so that every ${VAR:-default} takes its default.
func loadCompose(t *testing.T, profiles ...string) *types.Project {
	t.Helper()
	root := repoRoot(t)
	opts, err := cli.NewProjectOptions([]string{filepath.Join(root, composeFile)},
		cli.WithWorkingDirectory(root),
		cli.WithEnv([]string{}),
		cli.WithProfiles(profiles),
		cli.WithInterpolation(true),
		cli.WithNormalization(true),
		cli.WithConsistency(true),
		cli.WithResolvedPaths(true),
	)
	if err != nil {
		t.Fatal(err)
	}
	p, err := opts.LoadProject(context.Background())
	if err != nil {
		t.Fatalf("compose profiles %v: %v", profiles, err)
	}
	return p
}

func TestComposeProfiles(t *testing.T) {
	base := []string{"dispatcher", "gateway", "nats", "redis", "worker"}
	gpu := []string{"vllm-0", "vllm-1", "worker-gpu-0", "worker-gpu-1"}
	obs := []string{"grafana", "prometheus"}
	for _, tc := range []struct {
		profiles []string
		want     []string
	}{
		{nil, base},
		{[]string{"gpu"}, concat(base, gpu)},
		{[]string{"observability"}, concat(base, obs)},
		{[]string{"gpu", "observability"}, concat(base, gpu, obs)},
		{[]string{"*"}, concat(base, gpu, obs)},
	} {
		p := loadCompose(t, tc.profiles...)
		got := p.ServiceNames()
		sort.Strings(got)
		want := slices.Clone(tc.want)
		sort.Strings(want)
		if !slices.Equal(got, want) {
			t.Errorf("profiles %v: services %v, want %v", tc.profiles, got, want)
		}
	}
	// Two dispatchers and two sim workers by default.
	p := loadCompose(t)
	for _, name := range []string{"dispatcher", "worker"} {
		s := p.Services[name]
		if s.Deploy == nil || s.Deploy.Replicas == nil || *s.Deploy.Replicas != 2 {
			t.Errorf("%s: want deploy.replicas 2", name)
		}
	}
}

// healthcheckExempt lists services allowed to run without a healthcheck, with the reason.
var healthcheckExempt = map[string]string{}

// isTokenbus reports whether a service runs the tokenbus image.
func isTokenbus(s types.ServiceConfig) bool {
	return s.Build != nil && strings.HasSuffix(filepath.ToSlash(s.Build.Dockerfile), "deploy/Dockerfile")
}

func env(s types.ServiceConfig, key string) string {
	if v, ok := s.Environment[key]; ok && v != nil {
		return *v
	}
	return ""
}

func TestComposeServices(t *testing.T) {
	p := loadCompose(t, "*")
	root := repoRoot(t)
	published := map[string]string{}
	for _, name := range p.ServiceNames() {
		s := p.Services[name]
		t.Run(name, func(t *testing.T) {
			if s.Image == "" {
				t.Error("no image")
			}
			// Restart policy.
			if !slices.Contains([]string{"always", "unless-stopped", "on-failure"}, strings.SplitN(s.Restart, ":", 2)[0]) &&
				(s.Deploy == nil || s.Deploy.RestartPolicy == nil) {
				t.Errorf("restart policy %q: want always, unless-stopped or on-failure", s.Restart)
			}
			// Healthcheck.
			hc := s.HealthCheck
			if hc == nil || hc.Disable || len(hc.Test) < 2 {
				if reason, ok := healthcheckExempt[name]; ok {
					t.Logf("no healthcheck: %s", reason)
				} else {
					t.Error("no healthcheck (add one, or a reason to healthcheckExempt)")
				}
			} else {
				if hc.Interval == nil || hc.Timeout == nil || hc.Retries == nil {
					t.Error("healthcheck without interval, timeout or retries")
				}
				if hc.Test[0] != "CMD" && hc.Test[0] != "CMD-SHELL" {
					t.Errorf("healthcheck test %q: want CMD or CMD-SHELL", hc.Test)
				}
			}
			// Dependencies must be healthy before this service starts, and
			// must therefore have a healthcheck.
			for dep, d := range s.DependsOn {
				ds, ok := p.Services[dep]
				if !ok {
					t.Errorf("depends on unknown service %s", dep)
					continue
				}
				if d.Condition != types.ServiceConditionHealthy {
					t.Errorf("depends_on %s: condition %q, want service_healthy", dep, d.Condition)
				}
				if ds.HealthCheck == nil || ds.HealthCheck.Disable {
					t.Errorf("depends_on %s (service_healthy), which has no healthcheck", dep)
				}
			}
			// Bind mounts name files of this repository.
			for _, v := range s.Volumes {
				if v.Type != types.VolumeTypeBind {
					continue
				}
				if !strings.HasPrefix(v.Source, root) {
					t.Errorf("bind mount %s is outside the repository", v.Source)
				} else if _, err := os.Stat(v.Source); err != nil {
					t.Errorf("bind mount: %v", err)
				}
				if !v.ReadOnly {
					t.Errorf("bind mount %s: mount configuration read-only", v.Source)
				}
			}
			for _, port := range s.Ports {
				if port.Published == "" {
					continue
				}
				key := port.HostIP + ":" + port.Published
				if other, ok := published[key]; ok {
					t.Errorf("host port %s published by %s too", key, other)
				}
				published[key] = name
			}
			if isTokenbus(s) {
				checkComposeTokenbus(t, p, s)
			}
		})
	}
}

// checkComposeTokenbus checks a service running the tokenbus image.
func checkComposeTokenbus(t *testing.T, p *types.Project, s types.ServiceConfig) {
	if len(s.Command) == 0 {
		t.Fatal("tokenbus service without a command (the image defaults to `dev`)")
	}
	cmd := s.Command[0]
	var keys []string
	for k := range s.Environment {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	checkTokenbusEnv(t, s.Name, cmd, keys)

	// distroless: no shell, so only exec-form checks with the probe work.
	hc := s.HealthCheck
	if hc != nil && (hc.Test[0] != "CMD" || len(hc.Test) < 3 || hc.Test[1] != "/tokenbus-probe") {
		t.Errorf("healthcheck %q: the image has no shell; use [\"CMD\", \"/tokenbus-probe\", ...]", hc.Test)
	}
	listen := map[string]string{"gateway": env(s, "TOKENBUS_HTTP"), "dispatcher": env(s, "TOKENBUS_METRICS")}[cmd]
	if hc != nil && len(hc.Test) >= 4 && hc.Test[2] == "http" {
		u, err := url.Parse(hc.Test[3])
		if err != nil || listen == "" || !strings.HasSuffix(listen, ":"+u.Port()) {
			t.Errorf("healthcheck probes %s but the service listens on %q", hc.Test[3], listen)
		}
	}
	if cmd == "worker" && (hc == nil || hc.Test[2] != "heartbeat") {
		t.Error("a worker has no HTTP listener: its healthcheck must be the heartbeat probe")
	}
	for _, dep := range []string{"nats", "redis"} {
		if _, ok := s.DependsOn[dep]; !ok {
			t.Errorf("does not wait for %s", dep)
		}
	}
	// NATS URL and credentials.
	if u := env(s, "TOKENBUS_NATS_URL"); u != "nats://nats:4222" {
		t.Errorf("TOKENBUS_NATS_URL %q", u)
	}
	if env(s, "TOKENBUS_NATS_USER") == "" || env(s, "TOKENBUS_NATS_PASSWORD") == "" {
		t.Error("no NATS user and password")
	}
	// Redis URL: the compose redis, with its password.
	ru, err := url.Parse(env(s, "TOKENBUS_REDIS_URL"))
	if err != nil || ru.Hostname() != "redis" {
		t.Errorf("TOKENBUS_REDIS_URL %q: want the redis service", env(s, "TOKENBUS_REDIS_URL"))
	} else {
		pw, _ := ru.User.Password()
		rs := p.Services["redis"]
		if i := slices.Index(rs.Command, "--requirepass"); i < 0 || i+1 >= len(rs.Command) || rs.Command[i+1] != pw {
			t.Errorf("TOKENBUS_REDIS_URL password does not match redis --requirepass")
		}
		if env(rs, "REDISCLI_AUTH") != pw {
			t.Error("redis healthcheck password (REDISCLI_AUTH) does not match --requirepass")
		}
	}
	if cmd == "worker" {
		engine := env(s, "TOKENBUS_ENGINE")
		switch engine {
		case "sim":
		case "vllm", "openai":
			checkEngineURL(t, p, s)
		default:
			t.Errorf("TOKENBUS_ENGINE %q", engine)
		}
		if env(s, "TOKENBUS_MODEL") == "" {
			t.Error("no TOKENBUS_MODEL")
		}
	}
}

// checkEngineURL: a GPU worker drives a vLLM service of the same profile,
// on the port that vLLM listens on, serving the model the worker announces.
func checkEngineURL(t *testing.T, p *types.Project, s types.ServiceConfig) {
	u, err := url.Parse(env(s, "TOKENBUS_ENGINE_URL"))
	if err != nil || u.Host == "" {
		t.Fatalf("TOKENBUS_ENGINE_URL %q", env(s, "TOKENBUS_ENGINE_URL"))
	}
	vs, ok := p.Services[u.Hostname()]
	if !ok {
		t.Fatalf("TOKENBUS_ENGINE_URL host %s is no service", u.Hostname())
	}
	if !slices.Equal(vs.Profiles, s.Profiles) {
		t.Errorf("worker profiles %v, its vLLM %s has %v", s.Profiles, vs.Name, vs.Profiles)
	}
	if d, ok := s.DependsOn[vs.Name]; !ok || d.Condition != types.ServiceConditionHealthy {
		t.Errorf("does not wait for %s to be healthy", vs.Name)
	}
	if got := argValue(vs.Command, "--port"); got != u.Port() {
		t.Errorf("engine URL port %s, %s listens on --port %s", u.Port(), vs.Name, got)
	}
	if got := argValue(vs.Command, "--served-model-name"); got != env(s, "TOKENBUS_MODEL") {
		t.Errorf("worker model %q, %s serves %q", env(s, "TOKENBUS_MODEL"), vs.Name, got)
	}
}

func argValue(args []string, flag string) string {
	for i, a := range args {
		if a == flag && i+1 < len(args) {
			return args[i+1]
		}
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v
		}
	}
	return ""
}

func TestComposeGPU(t *testing.T) {
	p := loadCompose(t, "gpu")
	seen := map[string]string{}
	for _, name := range []string{"vllm-0", "vllm-1"} {
		s := p.Services[name]
		if env(s, "VLLM_ALLOW_RUNTIME_LORA_UPDATING") != "True" {
			t.Errorf("%s: VLLM_ALLOW_RUNTIME_LORA_UPDATING must be True (runtime LoRA loading)", name)
		}
		if _, ok := s.Environment["HUGGING_FACE_HUB_TOKEN"]; !ok {
			t.Errorf("%s: no HUGGING_FACE_HUB_TOKEN passthrough", name)
		}
		if !slices.Contains(s.Command, "--enable-lora") {
			t.Errorf("%s: no --enable-lora", name)
		}
		if !slices.ContainsFunc(s.Volumes, func(v types.ServiceVolumeConfig) bool {
			return v.Type == types.VolumeTypeVolume && v.Target == "/root/.cache/huggingface"
		}) {
			t.Errorf("%s: no Hugging Face cache volume", name)
		}
		if s.Deploy == nil || s.Deploy.Resources.Reservations == nil || len(s.Deploy.Resources.Reservations.Devices) != 1 {
			t.Fatalf("%s: no GPU reservation", name)
		}
		d := s.Deploy.Resources.Reservations.Devices[0]
		if d.Driver != "nvidia" || !slices.Contains(d.Capabilities, "gpu") || len(d.IDs) == 0 {
			t.Errorf("%s: GPU reservation %+v: want driver nvidia, capabilities [gpu], device_ids", name, d)
		}
		for _, id := range d.IDs {
			if other, ok := seen[id]; ok {
				t.Errorf("%s and %s both reserve GPU %s", name, other, id)
			}
			seen[id] = name
		}
	}
}

// promConfig is the part of prometheus.yml that this test reads.
type promConfig struct {
	Global        map[string]any `json:"global"`
	RuleFiles     []string       `json:"rule_files"`
	ScrapeConfigs []struct {
		JobName       string `json:"job_name"`
		MetricsPath   string `json:"metrics_path"`
		StaticConfigs []struct {
			Targets []string `json:"targets"`
		} `json:"static_configs"`
		DNSSDConfigs []struct {
			Names []string `json:"names"`
			Type  string   `json:"type"`
			Port  int      `json:"port"`
		} `json:"dns_sd_configs"`
	} `json:"scrape_configs"`
}

// TestPrometheusTargets: every scrape target is a compose service, on a port
// that service serves /metrics on.
func TestPrometheusTargets(t *testing.T) {
	var cfg promConfig
	if err := yaml.UnmarshalStrict(readFile(t, "deploy/prometheus/prometheus.yml"), &cfg); err != nil {
		t.Fatalf("prometheus.yml: %v", err)
	}
	p := loadCompose(t, "*")
	metricsPort := func(s types.ServiceConfig) string {
		if isTokenbus(s) {
			switch s.Command[0] {
			case "gateway":
				return strings.TrimPrefix(env(s, "TOKENBUS_HTTP"), ":")
			case "dispatcher", "worker":
				return strings.TrimPrefix(env(s, "TOKENBUS_METRICS"), ":")
			}
			return ""
		}
		if strings.HasPrefix(s.Image, "vllm/") {
			return argValue(s.Command, "--port")
		}
		return ""
	}
	scraped := map[string]bool{}
	for _, sc := range cfg.ScrapeConfigs {
		if sc.MetricsPath != "" && sc.MetricsPath != "/metrics" {
			t.Errorf("%s: metrics_path %s", sc.JobName, sc.MetricsPath)
		}
		var targets []string
		for _, st := range sc.StaticConfigs {
			targets = append(targets, st.Targets...)
		}
		for _, d := range sc.DNSSDConfigs {
			if d.Type != "A" || d.Port == 0 {
				t.Errorf("%s: dns_sd_configs want type A and a port", sc.JobName)
			}
			for _, n := range d.Names {
				targets = append(targets, fmt.Sprintf("%s:%d", n, d.Port))
			}
		}
		if len(targets) == 0 {
			t.Errorf("%s: no targets", sc.JobName)
		}
		for _, target := range targets {
			host, port, _ := strings.Cut(target, ":")
			if host == "localhost" {
				continue
			}
			s, ok := p.Services[host]
			if !ok {
				t.Errorf("%s: target %s is no compose service", sc.JobName, target)
				continue
			}
			if want := metricsPort(s); want != port {
				t.Errorf("%s: target %s, but %s serves /metrics on port %q", sc.JobName, target, host, want)
			}
			scraped[host] = true
		}
	}
	for _, must := range []string{"gateway", "dispatcher", "worker"} {
		if !scraped[must] {
			t.Errorf("prometheus does not scrape %s", must)
		}
	}
	// Workers expose no metrics yet: the day they get --metrics, scrape them.
	for _, name := range p.ServiceNames() {
		s := p.Services[name]
		if isTokenbus(s) && s.Command[0] == "worker" && env(s, "TOKENBUS_METRICS") != "" && !scraped[name] {
			t.Errorf("worker %s has TOKENBUS_METRICS but prometheus does not scrape it", name)
		}
	}
}

func concat(lists ...[]string) []string {
	var out []string
	for _, l := range lists {
		out = append(out, l...)
	}
	return out
}
