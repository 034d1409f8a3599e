package validate

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/url"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"
)

const chartDir = "deploy/helm/tokenbus"

// Kubernetes versions the chart is rendered and validated for: the oldest
// its kubeVersion admits and the newest with schemas at hand.
var kubeVersions = []string{"v1.30.0", "v1.37.0"}

// chartVariants are the values the chart is rendered with: its defaults and
// the example values under ci/.
var chartVariants = map[string]string{
	"default":        "",
	"gpu":            "ci/gpu-values.yaml",
	"keda":           "ci/keda-values.yaml",
	"secure":         "ci/secure-values.yaml",
	"redis-cluster":  "ci/redis-cluster-values.yaml",
	"redis-sentinel": "ci/redis-sentinel-values.yaml",
}

type manifest struct {
	source     string // template that rendered it
	raw        []byte // YAML
	apiVersion string
	kind       string
	name       string
	obj        runtime.Object // typed, for built-in kinds
}

func (m manifest) String() string { return fmt.Sprintf("%s %s (%s)", m.kind, m.name, m.source) }

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	ch, err := loader.Load(repoPath(t, chartDir))
	if err != nil {
		t.Fatalf("load chart: %v", err)
	}
	if err := ch.Validate(); err != nil {
		t.Fatalf("chart: %v", err)
	}
	return ch
}

func capabilities(t *testing.T, version string) *chartutil.Capabilities {
	caps := chartutil.DefaultCapabilities.Copy()
	v := strings.TrimPrefix(version, "v")
	parts := strings.Split(v, ".")
	caps.KubeVersion = chartutil.KubeVersion{Version: version, Major: parts[0], Minor: parts[1]}
	return caps
}

// renderChart renders the chart as `helm template` does (no cluster: lookup
// finds nothing) and returns its manifests, typed where Kubernetes knows the kind.
func renderChart(t *testing.T, ch *chart.Chart, kubeVersion string, vals map[string]any) ([]manifest, error) {
	t.Helper()
	caps := capabilities(t, kubeVersion)
	if !chartutil.IsCompatibleRange(ch.Metadata.KubeVersion, caps.KubeVersion.String()) {
		t.Fatalf("chart kubeVersion %q does not admit %s", ch.Metadata.KubeVersion, kubeVersion)
	}
	rv, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{
		Name: "tb", Namespace: "llm", Revision: 1, IsInstall: true,
	}, caps)
	if err != nil {
		return nil, err
	}
	out, err := engine.Render(ch, rv)
	if err != nil {
		return nil, err
	}
	var names []string
	for name := range out {
		names = append(names, name)
	}
	sort.Strings(names)
	var ms []manifest
	for _, name := range names {
		if !strings.HasSuffix(name, ".yaml") {
			continue // NOTES.txt, _helpers.tpl
		}
		for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(out[name], -1) {
			var head struct {
				APIVersion string `json:"apiVersion"`
				Kind       string `json:"kind"`
				Metadata   struct {
					Name string `json:"name"`
				} `json:"metadata"`
			}
			if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
				t.Errorf("%s: not YAML: %v\n%s", name, err, doc)
				continue
			}
			if head.Kind == "" && head.APIVersion == "" {
				if strings.TrimSpace(stripComments(doc)) != "" {
					t.Errorf("%s: a document without apiVersion and kind:\n%s", name, doc)
				}
				continue
			}
			ms = append(ms, manifest{source: name, raw: []byte(doc), apiVersion: head.APIVersion, kind: head.Kind, name: head.Metadata.Name})
		}
	}
	return ms, nil
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

func variantValues(t *testing.T, variant string) map[string]any {
	t.Helper()
	file := chartVariants[variant]
	if file == "" {
		return map[string]any{}
	}
	v, err := chartutil.ReadValuesFile(filepath.Join(repoPath(t, chartDir), file))
	if err != nil {
		t.Fatal(err)
	}
	return v.AsMap()
}

// strictCodecs decode built-in kinds and refuse unknown and duplicate fields,
// as the API server's strict field validation does.
var strictCodecs = serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict)

func TestHelmChart(t *testing.T) {
	ch := loadChart(t)
	schemas := k8sSchemas(t)
	for _, kv := range kubeVersions {
		for variant := range chartVariants {
			t.Run(variant+"/"+kv, func(t *testing.T) {
				ms, err := renderChart(t, ch, kv, variantValues(t, variant))
				if err != nil {
					t.Fatalf("render: %v", err)
				}
				if len(ms) == 0 {
					t.Fatal("rendered nothing")
				}
				for i := range ms {
					decodeManifest(t, &ms[i])
					if schemas != nil {
						schemas.validate(t, kv, ms[i])
					}
				}
				checkManifests(t, variant, ms)
			})
		}
	}
}

// decodeManifest decodes a built-in kind into its k8s.io/api type, strictly;
// and the custom resources into local mirrors of their types, strictly.
func decodeManifest(t *testing.T, m *manifest) {
	t.Helper()
	if err := decodeErr(m); err != nil {
		t.Errorf("%s: %v", m, err)
	}
}

func decodeErr(m *manifest) error {
	switch m.kind {
	case "ScaledObject":
		if m.apiVersion != "keda.sh/v1alpha1" {
			return fmt.Errorf("apiVersion %s", m.apiVersion)
		}
		var so scaledObject
		return strictJSONErr(m.raw, &so)
	case "ServiceMonitor":
		if m.apiVersion != "monitoring.coreos.com/v1" {
			return fmt.Errorf("apiVersion %s", m.apiVersion)
		}
		var sm serviceMonitor
		return strictJSONErr(m.raw, &sm)
	case "PrometheusRule":
		if m.apiVersion != "monitoring.coreos.com/v1" {
			return fmt.Errorf("apiVersion %s", m.apiVersion)
		}
		var pr prometheusRule
		return strictJSONErr(m.raw, &pr)
	}
	obj, _, err := strictCodecs.UniversalDeserializer().Decode(m.raw, nil, nil)
	if err != nil {
		return err
	}
	m.obj = obj
	return nil
}

func strictJSON(t *testing.T, m *manifest, into any) {
	t.Helper()
	if err := strictJSONErr(m.raw, into); err != nil {
		t.Errorf("%s: %v", m, err)
	}
}

func strictJSONErr(raw []byte, into any) error {
	j, err := yaml.YAMLToJSON(raw)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.DisallowUnknownFields()
	return dec.Decode(into)
}

// scaledObject mirrors KEDA's ScaledObject (keda.sh/v1alpha1, KEDA 2.x): the
// fields it has, with their types, so a typo or a wrong type fails here.
type scaledObject struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       struct {
		ScaleTargetRef struct {
			APIVersion             string `json:"apiVersion"`
			Kind                   string `json:"kind"`
			Name                   string `json:"name"`
			EnvSourceContainerName string `json:"envSourceContainerName"`
		} `json:"scaleTargetRef"`
		PollingInterval       *int32 `json:"pollingInterval"`
		InitialCooldownPeriod *int32 `json:"initialCooldownPeriod"`
		CooldownPeriod        *int32 `json:"cooldownPeriod"`
		IdleReplicaCount      *int32 `json:"idleReplicaCount"`
		MinReplicaCount       *int32 `json:"minReplicaCount"`
		MaxReplicaCount       *int32 `json:"maxReplicaCount"`
		Advanced              *struct {
			RestoreToOriginalReplicaCount bool `json:"restoreToOriginalReplicaCount"`
			HorizontalPodAutoscalerConfig *struct {
				Name     string                                         `json:"name"`
				Behavior *autoscalingv2.HorizontalPodAutoscalerBehavior `json:"behavior"`
			} `json:"horizontalPodAutoscalerConfig"`
			ScalingModifiers *struct {
				Formula          string `json:"formula"`
				Target           string `json:"target"`
				ActivationTarget string `json:"activationTarget"`
				MetricType       string `json:"metricType"`
			} `json:"scalingModifiers"`
		} `json:"advanced"`
		Triggers []struct {
			Type              string            `json:"type"`
			Name              string            `json:"name"`
			UseCachedMetrics  bool              `json:"useCachedMetrics"`
			Metadata          map[string]string `json:"metadata"` // KEDA wants strings only
			AuthenticationRef *struct {
				Name string `json:"name"`
				Kind string `json:"kind"`
			} `json:"authenticationRef"`
			MetricType string `json:"metricType"`
		} `json:"triggers"`
		Fallback *struct {
			FailureThreshold int32 `json:"failureThreshold"`
			Replicas         int32 `json:"replicas"`
		} `json:"fallback"`
	} `json:"spec"`
}

// serviceMonitor mirrors the fields of prometheus-operator's ServiceMonitor the chart uses.
type serviceMonitor struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       struct {
		JobLabel          string               `json:"jobLabel"`
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector *struct {
			Any        bool     `json:"any"`
			MatchNames []string `json:"matchNames"`
		} `json:"namespaceSelector"`
		Endpoints []struct {
			Port     string `json:"port"`
			Path     string `json:"path"`
			Interval string `json:"interval"`
			Scheme   string `json:"scheme"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// podSpecOf returns the pod template of a workload.
func podSpecOf(m manifest) (*corev1.PodTemplateSpec, *metav1.LabelSelector, *int32, bool) {
	switch o := m.obj.(type) {
	case *appsv1.Deployment:
		return &o.Spec.Template, o.Spec.Selector, o.Spec.Replicas, true
	case *appsv1.StatefulSet:
		return &o.Spec.Template, o.Spec.Selector, o.Spec.Replicas, true
	}
	return nil, nil, nil, false
}

func checkManifests(t *testing.T, variant string, ms []manifest) {
	byKind := map[string]map[string]manifest{}
	for _, m := range ms {
		if byKind[m.kind] == nil {
			byKind[m.kind] = map[string]manifest{}
		}
		if _, dup := byKind[m.kind][m.name]; dup {
			t.Errorf("two %s named %s", m.kind, m.name)
		}
		byKind[m.kind][m.name] = m
		if errs := validation.IsDNS1123Subdomain(m.name); len(errs) > 0 {
			t.Errorf("%s: name: %s", m, strings.Join(errs, "; "))
		}
		if m.kind == "Service" {
			if errs := validation.IsDNS1035Label(m.name); len(errs) > 0 {
				t.Errorf("%s: Service name: %s", m, strings.Join(errs, "; "))
			}
		}
	}
	configKeys := map[string]map[string]bool{}
	for name, m := range byKind["ConfigMap"] {
		if cm, ok := m.obj.(*corev1.ConfigMap); ok {
			configKeys[name] = map[string]bool{}
			for k := range cm.Data {
				configKeys[name][k] = true
			}
		}
	}
	secretKeys := map[string]map[string]bool{}
	for name, m := range byKind["Secret"] {
		if s, ok := m.obj.(*corev1.Secret); ok {
			secretKeys[name] = map[string]bool{}
			for k := range s.Data {
				secretKeys[name][k] = true
			}
			for k := range s.StringData {
				secretKeys[name][k] = true
			}
		}
	}

	type workload struct {
		m        manifest
		pod      *corev1.PodTemplateSpec
		replicas *int32
	}
	var workloads []workload
	for _, kind := range []string{"Deployment", "StatefulSet"} {
		for _, m := range byKind[kind] {
			pod, sel, replicas, _ := podSpecOf(m)
			if pod == nil {
				continue
			}
			workloads = append(workloads, workload{m, pod, replicas})
			s, err := metav1.LabelSelectorAsSelector(sel)
			if err != nil || s.Empty() || !s.Matches(labels.Set(pod.Labels)) {
				t.Errorf("%s: selector %v does not select its own pods %v", m, sel, pod.Labels)
			}
			if st, ok := m.obj.(*appsv1.StatefulSet); ok {
				if _, ok := byKind["Service"][st.Spec.ServiceName]; !ok {
					t.Errorf("%s: serviceName %s: no such Service", m, st.Spec.ServiceName)
				}
			}
			checkPod(t, m, pod, configKeys, secretKeys)
		}
	}
	selects := func(sel map[string]string) []workload {
		var out []workload
		for _, w := range workloads {
			if len(sel) > 0 && labels.SelectorFromSet(sel).Matches(labels.Set(w.pod.Labels)) {
				out = append(out, w)
			}
		}
		return out
	}
	for _, m := range byKind["Service"] {
		svc := m.obj.(*corev1.Service)
		ws := selects(svc.Spec.Selector)
		if len(ws) == 0 {
			t.Errorf("%s: selects no pods", m)
			continue
		}
		for _, p := range svc.Spec.Ports {
			if p.TargetPort.StrVal == "" {
				continue
			}
			for _, w := range ws {
				if !slices.ContainsFunc(w.pod.Spec.Containers, func(c corev1.Container) bool {
					return slices.ContainsFunc(c.Ports, func(cp corev1.ContainerPort) bool { return cp.Name == p.TargetPort.StrVal })
				}) {
					t.Errorf("%s: targetPort %s is no port of %s", m, p.TargetPort.StrVal, w.m)
				}
			}
		}
	}
	for _, m := range byKind["PodDisruptionBudget"] {
		pdb := m.obj.(*policyv1.PodDisruptionBudget)
		if len(selects(pdb.Spec.Selector.MatchLabels)) == 0 {
			t.Errorf("%s: selects no pods", m)
		}
	}
	target := func(kind, name string) *workload {
		for i := range workloads {
			if workloads[i].m.kind == kind && workloads[i].m.name == name {
				return &workloads[i]
			}
		}
		return nil
	}
	for _, m := range byKind["HorizontalPodAutoscaler"] {
		hpa := m.obj.(*autoscalingv2.HorizontalPodAutoscaler)
		ref := hpa.Spec.ScaleTargetRef
		w := target(ref.Kind, ref.Name)
		if w == nil {
			t.Errorf("%s: scaleTargetRef %s/%s: no such workload", m, ref.Kind, ref.Name)
		} else if w.replicas != nil {
			t.Errorf("%s: its target %s also fixes replicas (they would fight on every upgrade)", m, w.m)
		}
	}
	for _, m := range byKind["ScaledObject"] {
		checkScaledObject(t, m, func(kind, name string) (*corev1.PodTemplateSpec, *int32, bool) {
			w := target(kind, name)
			if w == nil {
				return nil, nil, false
			}
			return w.pod, w.replicas, true
		})
	}
	for _, m := range byKind["ServiceMonitor"] {
		var sm serviceMonitor
		strictJSON(t, &m, &sm)
		sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
		if err != nil {
			t.Errorf("%s: %v", m, err)
			continue
		}
		ports := map[string]bool{}
		matched := 0
		for _, sm := range byKind["Service"] {
			svc := sm.obj.(*corev1.Service)
			if sel.Matches(labels.Set(svc.Labels)) {
				matched++
				for _, p := range svc.Spec.Ports {
					ports[p.Name] = true
				}
			}
		}
		if matched == 0 {
			t.Errorf("%s: selects no Service", m)
		}
		for _, e := range sm.Spec.Endpoints {
			if !ports[e.Port] {
				t.Errorf("%s: endpoint port %s is on none of its Services", m, e.Port)
			}
		}
	}

	for _, m := range byKind["PrometheusRule"] {
		checkPrometheusRule(t, m)
	}

	// What each variant must contain.
	count := func(kind string) int { return len(byKind[kind]) }
	switch variant {
	case "default":
		want := map[string]int{"Deployment": 3, "StatefulSet": 0, "HorizontalPodAutoscaler": 1, "ScaledObject": 0,
			"Secret": 3, "ConfigMap": 1, "PodDisruptionBudget": 2, "ServiceAccount": 1}
		for kind, n := range want {
			if count(kind) != n {
				t.Errorf("%d %s, want %d", count(kind), kind, n)
			}
		}
	case "gpu":
		if count("StatefulSet") != 4 || count("Deployment") != 3 {
			t.Errorf("%d StatefulSets and %d Deployments, want 4 vLLM pools (2 of them prefill and decode) and gateway, dispatcher, one sim pool",
				count("StatefulSet"), count("Deployment"))
		}
		// The prefill and decode pools: their role, and vLLM's side
		// channel at the pod's IP.
		for _, m := range byKind["StatefulSet"] {
			st := m.obj.(*appsv1.StatefulSet)
			role := map[string]string{"tb-tokenbus-worker-llama-8b-prefill": "prefill", "tb-tokenbus-worker-llama-8b-decode": "decode"}[st.Name]
			if role == "" {
				role = "both"
			}
			var gotRole string
			side := false
			for _, c := range st.Spec.Template.Spec.Containers {
				for _, e := range c.Env {
					if e.Name == "TOKENBUS_ROLE" {
						gotRole = e.Value
					}
					if e.Name == "VLLM_NIXL_SIDE_CHANNEL_HOST" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil &&
						e.ValueFrom.FieldRef.FieldPath == "status.podIP" {
						side = true
					}
				}
			}
			if gotRole != role || side != (role != "both") {
				t.Errorf("%s: TOKENBUS_ROLE %q (want %q), side channel at the pod IP %v", st.Name, gotRole, role, side)
			}
		}
	case "keda":
		if count("ScaledObject") != 3 || count("ServiceMonitor") != 1 || count("PrometheusRule") != 1 {
			t.Errorf("%d ScaledObjects, %d ServiceMonitors and %d PrometheusRules, want one per pool, one and one",
				count("ScaledObject"), count("ServiceMonitor"), count("PrometheusRule"))
		}
	case "secure":
		if count("Secret") != 0 || count("HorizontalPodAutoscaler") != 0 {
			t.Errorf("%d Secrets and %d HPAs, want none (existing Secrets, autoscaling off)", count("Secret"), count("HorizontalPodAutoscaler"))
		}
	}
}

// checkPod checks the containers of a pod template.
func checkPod(t *testing.T, m manifest, pod *corev1.PodTemplateSpec, configKeys, secretKeys map[string]map[string]bool) {
	spec := pod.Spec
	volumes := map[string]bool{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = true
	}
	if st, ok := m.obj.(*appsv1.StatefulSet); ok {
		for _, c := range st.Spec.VolumeClaimTemplates {
			volumes[c.Name] = true
		}
	}
	var vllm *corev1.Container
	var worker *corev1.Container
	for i := range spec.Containers {
		c := &spec.Containers[i]
		where := fmt.Sprintf("%s container %s", m, c.Name)
		if c.Image == "" {
			t.Errorf("%s: no image", where)
		}
		for _, vm := range c.VolumeMounts {
			if !volumes[vm.Name] {
				t.Errorf("%s: mounts volume %s, which the pod does not have", where, vm.Name)
			}
		}
		ports := map[string]int32{}
		for _, p := range c.Ports {
			ports[p.Name] = p.ContainerPort
		}
		for _, pr := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe, c.StartupProbe} {
			if pr == nil {
				continue
			}
			if pr.HTTPGet != nil && pr.HTTPGet.Port.StrVal != "" {
				if _, ok := ports[pr.HTTPGet.Port.StrVal]; !ok {
					t.Errorf("%s: probe on port %s, which the container does not name", where, pr.HTTPGet.Port.StrVal)
				}
			}
		}
		// Every reference to a chart-made ConfigMap or Secret names a key it has.
		var envNames []string
		for _, e := range c.Env {
			envNames = append(envNames, e.Name)
			if e.ValueFrom == nil {
				continue
			}
			if r := e.ValueFrom.SecretKeyRef; r != nil {
				if keys, ours := secretKeys[r.Name]; ours && !keys[r.Key] {
					t.Errorf("%s: %s from Secret %s key %s, which it does not have", where, e.Name, r.Name, r.Key)
				}
			}
			if r := e.ValueFrom.ConfigMapKeyRef; r != nil {
				if keys, ours := configKeys[r.Name]; ours && !keys[r.Key] {
					t.Errorf("%s: %s from ConfigMap %s key %s, which it does not have", where, e.Name, r.Name, r.Key)
				}
			}
		}
		for _, ef := range c.EnvFrom {
			if ef.ConfigMapRef != nil {
				keys, ok := configKeys[ef.ConfigMapRef.Name]
				if !ok {
					t.Errorf("%s: envFrom ConfigMap %s is not in the chart", where, ef.ConfigMapRef.Name)
				}
				for k := range keys {
					envNames = append(envNames, k)
				}
			}
		}
		if c.Name == "vllm" {
			vllm = c
			continue
		}
		// A tokenbus container.
		if !strings.Contains(c.Image, "tokenbus") {
			t.Errorf("%s: image %s: want the tokenbus image", where, c.Image)
		}
		if len(c.Args) == 0 {
			t.Errorf("%s: no subcommand (the image defaults to `dev`)", where)
			continue
		}
		cmd := c.Args[0]
		sort.Strings(envNames)
		checkTokenbusEnv(t, where, cmd, envNames)
		if cmd == "worker" {
			worker = c
		}
		// Hardened: non-root, read-only root, no privilege escalation.
		sc := c.SecurityContext
		psc := spec.SecurityContext
		nonRoot := (sc != nil && sc.RunAsNonRoot != nil && *sc.RunAsNonRoot) || (psc != nil && psc.RunAsNonRoot != nil && *psc.RunAsNonRoot)
		if !nonRoot || sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
			sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Errorf("%s: want runAsNonRoot, readOnlyRootFilesystem and no privilege escalation", where)
		}
		for _, pr := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe, c.StartupProbe} {
			if pr != nil && pr.Exec != nil && (len(pr.Exec.Command) < 2 || pr.Exec.Command[0] != "/tokenbus-probe") {
				t.Errorf("%s: exec probe %q: the image has no shell; use /tokenbus-probe", where, pr.Exec.Command)
			}
		}
		switch cmd {
		case "gateway":
			if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet == nil || c.LivenessProbe.HTTPGet.Path != "/health" {
				t.Errorf("%s: liveness probe must GET /health", where)
			}
			if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/ready" {
				t.Errorf("%s: readiness probe must GET /ready", where)
			}
			if listen := envValue(c, "TOKENBUS_HTTP"); !strings.HasSuffix(listen, fmt.Sprintf(":%d", ports["http"])) {
				t.Errorf("%s: TOKENBUS_HTTP %q but container port http is %d", where, listen, ports["http"])
			}
		case "dispatcher":
			if listen := envValue(c, "TOKENBUS_METRICS"); !strings.HasSuffix(listen, fmt.Sprintf(":%d", ports["metrics"])) {
				t.Errorf("%s: TOKENBUS_METRICS %q but container port metrics is %d", where, listen, ports["metrics"])
			}
		case "worker":
			if c.LivenessProbe == nil || c.LivenessProbe.Exec == nil || !slices.Contains(c.LivenessProbe.Exec.Command, "heartbeat") {
				t.Errorf("%s: a worker has no HTTP listener: its liveness probe must be the heartbeat probe", where)
			}
			if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
				return e.Name == "TOKENBUS_ID" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil
			}) {
				t.Errorf("%s: TOKENBUS_ID should be the pod name (the heartbeat probe looks for it)", where)
			}
		}
	}
	if vllm == nil {
		return
	}
	// A vLLM pod: GPUs, runtime LoRA, and a worker driving it over loopback.
	where := fmt.Sprintf("%s container vllm", m)
	gpus := vllm.Resources.Limits["nvidia.com/gpu"]
	if gpus.Value() < 1 {
		t.Errorf("%s: no nvidia.com/gpu limit", where)
	}
	if envValue(vllm, "VLLM_ALLOW_RUNTIME_LORA_UPDATING") != "True" {
		t.Errorf("%s: VLLM_ALLOW_RUNTIME_LORA_UPDATING must be True", where)
	}
	if !slices.Contains(vllm.Args, "--enable-lora") {
		t.Errorf("%s: no --enable-lora", where)
	}
	if !slices.ContainsFunc(spec.Tolerations, func(tl corev1.Toleration) bool { return tl.Key == "nvidia.com/gpu" }) {
		t.Errorf("%s: no toleration for GPU nodes' nvidia.com/gpu taint", m)
	}
	if worker == nil {
		t.Fatalf("%s: a vLLM pod without a tokenbus worker", m)
	}
	if envValue(worker, "TOKENBUS_ENGINE") != "vllm" {
		t.Errorf("%s: worker engine %q beside vLLM", m, envValue(worker, "TOKENBUS_ENGINE"))
	}
	u, err := url.Parse(envValue(worker, "TOKENBUS_ENGINE_URL"))
	port := "0"
	for _, p := range vllm.Ports {
		if p.Name == "vllm" {
			port = strconv.Itoa(int(p.ContainerPort))
		}
	}
	if err != nil || u.Hostname() != "127.0.0.1" || u.Port() != port || argValue(vllm.Args, "--port") != port {
		t.Errorf("%s: worker engine URL %q, vLLM --port %s, container port %s", m, envValue(worker, "TOKENBUS_ENGINE_URL"),
			argValue(vllm.Args, "--port"), port)
	}
	if got := argValue(vllm.Args, "--served-model-name"); got != envValue(worker, "TOKENBUS_MODEL") {
		t.Errorf("%s: vLLM serves %q, the worker announces %q", m, got, envValue(worker, "TOKENBUS_MODEL"))
	}
	// The worker must drain before vLLM stops.
	if vllm.Lifecycle == nil || vllm.Lifecycle.PreStop == nil {
		t.Errorf("%s: no preStop delay: vLLM would stop while the worker drains", where)
	}
}

func envValue(c *corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

func checkScaledObject(t *testing.T, m manifest, target func(kind, name string) (*corev1.PodTemplateSpec, *int32, bool)) {
	var so scaledObject
	strictJSON(t, &m, &so)
	ref := so.Spec.ScaleTargetRef
	pod, replicas, ok := target(ref.Kind, ref.Name)
	if !ok || ref.APIVersion != "apps/v1" {
		t.Errorf("%s: scaleTargetRef %s %s/%s: no such workload", m, ref.APIVersion, ref.Kind, ref.Name)
		return
	}
	if replicas != nil {
		t.Errorf("%s: its target also fixes replicas (it would fight KEDA on every upgrade)", m)
	}
	if so.Spec.MinReplicaCount == nil || *so.Spec.MinReplicaCount < 0 {
		t.Errorf("%s: minReplicaCount must be set, 0 or more", m)
	}
	if so.Spec.MaxReplicaCount == nil || (so.Spec.MinReplicaCount != nil && *so.Spec.MaxReplicaCount < *so.Spec.MinReplicaCount) {
		t.Errorf("%s: maxReplicaCount below minReplicaCount", m)
	}
	var model string
	for _, c := range pod.Spec.Containers {
		if len(c.Args) > 0 && c.Args[0] == "worker" {
			model = envValue(&c, "TOKENBUS_MODEL")
		}
	}
	if len(so.Spec.Triggers) == 0 {
		t.Errorf("%s: no triggers", m)
	}
	for _, tr := range so.Spec.Triggers {
		if tr.Type != "prometheus" {
			t.Errorf("%s: trigger type %s", m, tr.Type)
			continue
		}
		for _, k := range []string{"serverAddress", "query", "threshold"} {
			if tr.Metadata[k] == "" {
				t.Errorf("%s: prometheus trigger without %s", m, k)
			}
		}
		if u, err := url.Parse(tr.Metadata["serverAddress"]); err != nil || u.Scheme == "" || u.Host == "" {
			t.Errorf("%s: serverAddress %q", m, tr.Metadata["serverAddress"])
		}
		if v, err := strconv.ParseFloat(tr.Metadata["threshold"], 64); err != nil || v <= 0 {
			t.Errorf("%s: threshold %q", m, tr.Metadata["threshold"])
		}
		// A pool at zero is started when a request waits for it (held for
		// capacity, docs/capacity.md): active as soon as the query is above 0.
		if *so.Spec.MinReplicaCount == 0 && tr.Metadata["activationThreshold"] != "0" {
			t.Errorf("%s: scaled to zero with activationThreshold %q: want \"0\", active while any request waits", m, tr.Metadata["activationThreshold"])
		}
		// The query is PromQL over known metrics, for this pool's model.
		sel := checkPromQL(t, m.String(), tr.Metadata["query"])
		if got := sel["tokenbus_dispatcher_queue_depth"]; got == nil || got["model"] != model {
			t.Errorf("%s: query %q: want tokenbus_dispatcher_queue_depth{model=%q} (the model its workers serve)", m, tr.Metadata["query"], model)
		}
	}
}

// TestHelmRejects: values that would deploy something broken fail to render.
func TestHelmRejects(t *testing.T) {
	ch := loadChart(t)
	for name, tc := range map[string]struct {
		vals string
		want string
	}{
		"negative minReplicas": {`{"keda":{"enabled":true},"workers":{"pools":[{"name":"a","model":"a","autoscaling":{"minReplicas":-1}}]}}`, "minReplicas must be 0 or more"},
		"unknown engine":       {`{"workers":{"pools":[{"name":"a","model":"a","engine":"tgi"}]}}`, "engine must be sim or vllm"},
		"unknown role":         {`{"workers":{"pools":[{"name":"a","model":"a","role":"prefil"}]}}`, "role must be both, prefill or decode"},
		"decode without a KV connector": {`{"workers":{"pools":[{"name":"a","model":"a","engine":"vllm","role":"decode"}]}}`,
			"needs vLLM's KV connector"},
		"pool without model":     {`{"workers":{"pools":[{"name":"a"}]}}`, "model is required"},
		"creds without secret":   {`{"nats":{"auth":{"mode":"creds"}}}`, "existingSecret"},
		"tls without secret":     {`{"nats":{"tls":{"enabled":true}}}`, "nats.tls.secretName is required"},
		"unknown redis topology": {`{"redis":{"topology":"ring"}}`, "redis.topology must be single, sentinel or cluster"},
	} {
		var vals map[string]any
		if err := json.Unmarshal([]byte(tc.vals), &vals); err != nil {
			t.Fatal(err)
		}
		_, err := renderChart(t, ch, kubeVersions[0], vals)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error with %q", name, err, tc.want)
		}
	}
}

// TestHelmRedisTopology: every tokenbus container names Redis in the
// variable of the chart's redis.topology (one flag per topology), from the
// Secret, and the gateway gets --redis-min-replicas: redis.minReplicas as
// given, 0 (no replicas) included, and auto when unset.
func TestHelmRedisTopology(t *testing.T) {
	ch := loadChart(t)
	for _, tc := range []struct {
		variant, env, replicas string
		minReplicas            any // redis.minReplicas set over the variant's; nil: left
	}{
		{"default", "TOKENBUS_REDIS_URL", "auto", nil},
		{"redis-sentinel", "TOKENBUS_REDIS_SENTINEL", "1", nil},
		{"redis-cluster", "TOKENBUS_REDIS_CLUSTER", "auto", nil},
		{"redis-cluster", "TOKENBUS_REDIS_CLUSTER", "0", 0},
		{"redis-sentinel", "TOKENBUS_REDIS_SENTINEL", "2", 2},
		{"redis-sentinel", "TOKENBUS_REDIS_SENTINEL", "auto", "auto"},
	} {
		vals := variantValues(t, tc.variant)
		if tc.minReplicas != nil {
			redis, _ := vals["redis"].(map[string]any)
			if redis == nil {
				redis = map[string]any{}
				vals["redis"] = redis
			}
			redis["minReplicas"] = tc.minReplicas
		}
		ms, err := renderChart(t, ch, kubeVersions[1], vals)
		if err != nil {
			t.Fatal(err)
		}
		seen := 0
		for i := range ms {
			decodeManifest(t, &ms[i])
			var pod *corev1.PodTemplateSpec
			switch o := ms[i].obj.(type) {
			case *appsv1.Deployment:
				pod = &o.Spec.Template
			case *appsv1.StatefulSet:
				pod = &o.Spec.Template
			default:
				continue
			}
			for _, c := range pod.Spec.Containers {
				if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return strings.HasPrefix(e.Name, "TOKENBUS_NATS") }) {
					continue // not a tokenbus container (vLLM)
				}
				seen++
				var names []string
				for _, e := range c.Env {
					if e.Name == "TOKENBUS_REDIS_URL" || e.Name == "TOKENBUS_REDIS_SENTINEL" || e.Name == "TOKENBUS_REDIS_CLUSTER" {
						names = append(names, e.Name)
						if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.ValueFrom.SecretKeyRef.Key != "redis-url" {
							t.Errorf("%s %s: %s not from the Secret's redis-url", tc.variant, ms[i], e.Name)
						}
					}
				}
				if !slices.Equal(names, []string{tc.env}) {
					t.Errorf("%s %s: Redis variables %v, want [%s]", tc.variant, ms[i], names, tc.env)
				}
				gateway := strings.Contains(ms[i].name, "gateway")
				if got := envValue(&c, "TOKENBUS_REDIS_MIN_REPLICAS"); gateway && got != tc.replicas || !gateway && got != "" {
					t.Errorf("%s %s: TOKENBUS_REDIS_MIN_REPLICAS %q", tc.variant, ms[i], got)
				}
			}
		}
		if seen < 3 {
			t.Errorf("%s: %d tokenbus containers rendered, want gateway, dispatcher and workers", tc.variant, seen)
		}
	}
}

// TestHelmPoolOverrides: a pool overrides any default, false and 0 included
// (sprig's merge cannot, hence tokenbus.deepSet).
func TestHelmPoolOverrides(t *testing.T) {
	ch := loadChart(t)
	var vals map[string]any
	_ = json.Unmarshal([]byte(`{"workers":{"pools":[{"name":"big","model":"big","engine":"vllm","replicas":3,
		"vllm":{"gpus":2,"cache":{"enabled":false}}}]}}`), &vals)
	ms, err := renderChart(t, ch, kubeVersions[1], vals)
	if err != nil {
		t.Fatal(err)
	}
	for i := range ms {
		decodeManifest(t, &ms[i])
		st, ok := ms[i].obj.(*appsv1.StatefulSet)
		if !ok {
			continue
		}
		if len(st.Spec.VolumeClaimTemplates) != 0 {
			t.Error("cache.enabled false did not override the default")
		}
		if *st.Spec.Replicas != 3 {
			t.Errorf("replicas %d", *st.Spec.Replicas)
		}
		gpus := st.Spec.Template.Spec.Containers[0].Resources.Limits["nvidia.com/gpu"]
		if gpus.Value() != 2 {
			t.Errorf("gpus %v", gpus)
		}
		// Defaults the pool did not touch survive.
		if !slices.Contains(st.Spec.Template.Spec.Containers[0].Args, "--enable-lora") {
			t.Error("default vLLM args lost")
		}
		return
	}
	t.Fatal("no StatefulSet rendered")
}

// TestValidatorCatches makes sure each layer of the manifest validation
// bites: a chart change that produced these would fail TestHelmChart.
func TestValidatorCatches(t *testing.T) {
	ch := loadChart(t)
	schemas := k8sSchemas(t)
	render := func(extraEnv string) manifest {
		var vals map[string]any
		if err := json.Unmarshal([]byte(`{"gateway":{"extraEnv":`+extraEnv+`}}`), &vals); err != nil {
			t.Fatal(err)
		}
		ms, err := renderChart(t, ch, kubeVersions[0], vals)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			if m.kind == "Deployment" && strings.HasSuffix(m.name, "-gateway") {
				return m
			}
		}
		t.Fatal("no gateway Deployment")
		return manifest{}
	}
	// Unknown field: strict decoding refuses it.
	m := render(`[{"name":"X","valu":"y"}]`)
	if err := decodeErr(&m); err == nil || !strings.Contains(err.Error(), "valu") {
		t.Errorf("unknown field: strict decoding said %v", err)
	}
	// Wrong type: so does decoding.
	m = render(`[{"name":"X","value":3}]`)
	if err := decodeErr(&m); err == nil {
		t.Error("a number where a string belongs: strict decoding accepted it")
	}
	// Missing required field: only the schema knows.
	m = render(`[{"value":"y"}]`)
	if err := decodeErr(&m); err != nil {
		t.Fatalf("decoding: %v", err)
	}
	if schemas == nil {
		t.Skipf("%s not set: the schema layer is not checked", schemaEnv)
	}
	if err := schemas.validateErr(kubeVersions[0], m); err == nil || !strings.Contains(err.Error(), "name") {
		t.Errorf("env var without a name: schema said %v", err)
	}
	m = render(`[{"name":"X","valu":"y"}]`)
	_ = decodeErr(&m)
	m.obj = &appsv1.Deployment{} // validate even though decoding failed
	if err := schemas.validateErr(kubeVersions[0], m); err == nil || !strings.Contains(err.Error(), "valu") {
		t.Errorf("unknown field: schema said %v", err)
	}
}
