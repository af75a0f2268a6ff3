package kubernetes

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/berth-dev/berth/pkg/runtime"
)

// Names of what a sandbox Pod holds.
const (
	// containerName is the sandbox's own container (the image, the agent as
	// its PID 1).
	containerName = "sandbox"
	// installName is the init container that copies the agent.
	installName = "berth-agent-install"
	// agentVolume is the emptyDir the agent is copied into, mounted
	// read-only at runtime.AgentDir in the sandbox's container.
	agentVolume = "berth-agent"
	// agentStateVolume is the emptyDir at runtime.AgentStateDir: the
	// agent's state stays out of the image's file system, as on the other
	// backends, and lives as long as the Pod.
	agentStateVolume = "berth-agent-state"
	// workspaceVolume is the sandbox's PersistentVolumeClaim (claimName,
	// or the spare claim Create took: spare.go),
	// mounted at workDir: it outlives the Pod, so the files survive a
	// Restart and a hibernate (which replace the Pod), and goes with the
	// sandbox (Remove). A persistent workspace's claim (volumes.go) takes
	// its place and outlives the sandbox too.
	workspaceVolume = "workspace"
	// DefaultWorkspaceSize is the size a workspace claim requests when the
	// sandbox has no disk limit.
	DefaultWorkspaceSize = 1 << 30
	// workDir is the agent's working directory. The API server cannot tell
	// an image's WORKDIR (only the node's runtime reads the image), so it
	// is always runtime.DefaultWorkDir here.
	workDir = runtime.DefaultWorkDir
	// installerPath and agentInImage are where the agent image holds the
	// installer (package installer) and the static agent.
	installerPath = "/installer"
	agentInImage  = "/sandbox-agent"
	// tokenKey is the key of the agent token in the sandbox's Secret.
	tokenKey = "agent-token"
	// appKeyKey is the key of the app's key (Spec.App.Key) in that Secret.
	appKeyKey = "app-key"
	// secretPrefix prefixes the keys of Spec.Secrets in that Secret.
	secretPrefix = "secret."
	// labelsAnnotation holds all of berth's labels of the sandbox as JSON,
	// exactly: Kubernetes label values are limited to 63 characters of
	// [A-Za-z0-9_.-], lease and conversation ids and user labels are not.
	labelsAnnotation = "dev.berth/labels"
	// diskAnnotation records Sandbox.DiskEnforcement.
	diskAnnotation = "dev.berth/disk-enforcement"
	// LabelSandbox is the Kubernetes label naming the sandbox (its Pod) on
	// every object berth creates for it (the Pod, its Secret).
	LabelSandbox = "dev.berth.sandbox"
	// stopGrace is the Pod's termination grace period: the agent exits at
	// once on SIGTERM, its commands get this long.
	stopGrace = 10
)

// podName returns the deterministic name of lease's Pod: "berth-" and the
// lease id when that is a valid DNS label, else a sanitised prefix of it
// and a hash of the whole id, so that two leases never share a name.
func podName(leaseID string) string {
	const max = validation.DNS1123LabelMaxLength // the Pod's hostname too
	clean := strings.Map(func(c rune) rune {
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-':
			return c
		case c >= 'A' && c <= 'Z':
			return c + 'a' - 'A'
		default:
			return '-'
		}
	}, leaseID)
	name := "berth-" + clean
	if clean == leaseID && len(name) <= max && !strings.HasSuffix(name, "-") {
		return name
	}
	sum := sha256.Sum256([]byte(leaseID))
	suffix := "-" + hex.EncodeToString(sum[:4])
	if len(name) > max-len(suffix) {
		name = name[:max-len(suffix)]
	}
	return strings.TrimRight(name, "-") + suffix
}

// claimName is the name of the PersistentVolumeClaim holding a sandbox's
// workspace.
func claimName(pod string) string { return pod + "-workspace" }

// secretName is the name of the Secret holding a sandbox's agent token and
// secrets.
func secretName(pod string) string { return pod + "-agent" }

// kubeLabels returns the Kubernetes labels of a sandbox's objects: berth's
// labels whose key and value Kubernetes accepts (so that the API server
// can select on them), and LabelSandbox. labelsAnnotation holds them all.
func kubeLabels(labels map[string]string, pod string) map[string]string {
	out := map[string]string{LabelSandbox: pod}
	for k, v := range labels {
		if len(validation.IsQualifiedName(k)) == 0 && len(validation.IsValidLabelValue(v)) == 0 {
			out[k] = v
		}
	}
	return out
}

// labelsOf returns berth's labels of a Pod: labelsAnnotation, or the
// Kubernetes labels when it has none.
func labelsOf(meta metav1.ObjectMeta) map[string]string {
	if s, ok := meta.Annotations[labelsAnnotation]; ok {
		var m map[string]string
		if json.Unmarshal([]byte(s), &m) == nil {
			return m
		}
	}
	out := maps.Clone(meta.Labels)
	delete(out, LabelSandbox)
	return out
}

// Requests are these fractions of the limits: a sandbox is mostly idle
// (an agent waiting for commands), so reserving its whole limit would fit
// a handful of sandboxes on a node where the other backends run a hundred.
const (
	cpuRequestDivisor    = 10
	memoryRequestDivisor = 4
)

// limits returns the limits of res. The pids limit has no place in a Pod
// (it is the kubelet's podPidsLimit, one value for the node); the disk
// limit becomes ephemeral-storage, which the kubelet enforces by evicting
// the Pod.
func limits(res runtime.Resources) corev1.ResourceList {
	rl := corev1.ResourceList{}
	if res.NanoCPUs > 0 {
		rl[corev1.ResourceCPU] = *resource.NewMilliQuantity(res.NanoCPUs/1_000_000, resource.DecimalSI)
	}
	if res.MemoryBytes > 0 {
		rl[corev1.ResourceMemory] = *resource.NewQuantity(res.MemoryBytes, resource.BinarySI)
	}
	if res.DiskBytes > 0 {
		rl[corev1.ResourceEphemeralStorage] = *resource.NewQuantity(res.DiskBytes, resource.BinarySI)
	}
	return rl
}

// requests returns the requests of res: a tenth of its CPU (at least 10m)
// and a quarter of its memory (Burstable QoS; the limits still bound it).
func requests(res runtime.Resources) corev1.ResourceList {
	rl := corev1.ResourceList{}
	if res.NanoCPUs > 0 {
		rl[corev1.ResourceCPU] = *resource.NewMilliQuantity(max(res.NanoCPUs/1_000_000/cpuRequestDivisor, 10), resource.DecimalSI)
	}
	if res.MemoryBytes > 0 {
		rl[corev1.ResourceMemory] = *resource.NewQuantity(res.MemoryBytes/memoryRequestDivisor, resource.BinarySI)
	}
	return rl
}

// installResources returns the resources of the init container that
// copies the agent: the sandbox's own CPU and memory limits (the copy is a
// part of its start), and small requests (it runs before the sandbox, so
// the Pod's request is the sandbox's). Not a limit of its own: a limit of
// 10 millicores made the kernel's CFS quota stretch runc's start of the
// container and the 17 MB copy to 2-3 s each (docs/kubernetes.md, Cold
// start).
func installResources(res runtime.Resources) corev1.ResourceRequirements {
	rr := corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
		Limits:   corev1.ResourceList{},
	}
	lim := limits(res)
	for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		l, ok := lim[name]
		if !ok {
			continue
		}
		rr.Limits[name] = l
		if req := rr.Requests[name]; req.Cmp(l) > 0 {
			rr.Requests[name] = l
		}
	}
	return rr
}

// capabilities returns runtime.Capabilities in Kubernetes' type.
func capabilities() []corev1.Capability {
	var out []corev1.Capability
	for _, c := range runtime.Capabilities() {
		out = append(out, corev1.Capability(c))
	}
	return out
}

// buildClaim returns the workspace claim of the sandbox whose objects
// have meta: ReadWriteOnce, Config.StorageClass (nil: the cluster's
// default StorageClass), the disk limit as its size (else
// DefaultWorkspaceSize).
func (r *Runtime) buildClaim(meta metav1.ObjectMeta, res runtime.Resources) *corev1.PersistentVolumeClaim {
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: *meta.DeepCopy(), Spec: r.claimSpec(res)}
	pvc.Name = claimName(meta.Name)
	delete(pvc.Annotations, diskAnnotation)
	return pvc
}

// claimSpec is the spec of a workspace claim: ReadWriteOnce,
// Config.StorageClass (nil: the cluster's default StorageClass), the disk
// limit as its size (else DefaultWorkspaceSize).
func (r *Runtime) claimSpec(res runtime.Resources) corev1.PersistentVolumeClaimSpec {
	size := int64(DefaultWorkspaceSize)
	if res.DiskBytes > 0 {
		size = res.DiskBytes
	}
	spec := corev1.PersistentVolumeClaimSpec{
		AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{
			corev1.ResourceStorage: *resource.NewQuantity(size, resource.BinarySI)}},
	}
	if r.cfg.StorageClass != "" {
		sc := r.cfg.StorageClass
		spec.StorageClassName = &sc
	}
	return spec
}

// workspaceMount returns spec's workspace volume (a runtime.MountVolume
// at workDir: a persistent workspace, volumes.go), nil when it has none
// (the workspace is then the sandbox's own claim).
func workspaceMount(spec runtime.Spec) *runtime.Mount {
	for i, m := range spec.Mounts {
		if m.Type == runtime.MountVolume && m.Target == workDir {
			return &spec.Mounts[i]
		}
	}
	return nil
}

// claimOfPod returns the claim holding pod's workspace ("" when none).
func claimOfPod(pod *corev1.Pod) string {
	for _, v := range pod.Spec.Volumes {
		if v.Name == workspaceVolume && v.PersistentVolumeClaim != nil {
			return v.PersistentVolumeClaim.ClaimName
		}
	}
	return ""
}

// buildObjects returns the Secret and the Pod of spec (validated, its
// resources filled in). The hardening of the other backends becomes the
// securityContext: every capability dropped but runtime.Capabilities, no
// privilege escalation (no-new-privileges), the runtime's default seccomp
// profile, never privileged.
func (r *Runtime) buildObjects(spec runtime.Spec, res runtime.Resources) (*corev1.Secret, *corev1.Pod) {
	name := podName(spec.LeaseID)
	labels := runtime.SandboxLabels(spec, r.cfg.InstanceID)
	labelsJSON, _ := json.Marshal(labels)
	disk := runtime.DiskEnforcementNone
	if res.DiskBytes > 0 {
		disk = runtime.DiskEnforcementEngine
	}
	meta := metav1.ObjectMeta{
		Name:      name,
		Namespace: r.cfg.Namespace,
		Labels:    kubeLabels(labels, name),
		Annotations: map[string]string{
			labelsAnnotation: string(labelsJSON),
			diskAnnotation:   disk,
		},
	}

	secret := &corev1.Secret{
		ObjectMeta: *meta.DeepCopy(),
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{tokenKey: []byte(spec.AgentToken)},
	}
	secret.Name = secretName(name)
	delete(secret.Annotations, diskAnnotation)

	// The environment: Env as values, the token and Secrets by reference
	// to the Secret, so that no secret is in the Pod object.
	env := []corev1.EnvVar{{Name: runtime.AgentTokenEnv, ValueFrom: secretRef(secret.Name, tokenKey)}}
	for _, k := range slices.Sorted(maps.Keys(spec.Env)) {
		env = append(env, corev1.EnvVar{Name: k, Value: spec.Env[k]})
	}
	for _, k := range slices.Sorted(maps.Keys(spec.Secrets)) {
		secret.Data[secretPrefix+k] = []byte(spec.Secrets[k])
		env = append(env, corev1.EnvVar{Name: k, ValueFrom: secretRef(secret.Name, secretPrefix+k)})
	}
	if len(spec.Secrets) > 0 {
		env = append(env, corev1.EnvVar{Name: runtime.AgentSecretsEnv, Value: spec.Environ()[runtime.AgentSecretsEnv]})
	}
	if spec.App != nil && spec.App.Key != "" {
		secret.Data[appKeyKey] = []byte(spec.App.Key)
		env = append(env, corev1.EnvVar{Name: runtime.AgentAppKeyEnv, ValueFrom: secretRef(secret.Name, appKeyKey)})
	}

	no, yes := false, true
	grace := int64(stopGrace)
	nobody := int64(65534)
	sc := &corev1.SecurityContext{
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: capabilities()},
		AllowPrivilegeEscalation: &no,
		Privileged:               &no,
		SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
	if spec.User != "" {
		// The agent runs as root and runs commands as spec.User (like on
		// the other backends). Without a user the image's configured user
		// runs the agent: the API server cannot read the image's
		// configuration to pass it to the agent as its default user.
		root := int64(0)
		sc.RunAsUser, sc.RunAsGroup = &root, &root
	}
	install := corev1.Container{
		Name:            installName,
		Image:           r.cfg.AgentImage,
		ImagePullPolicy: r.cfg.AgentImagePullPolicy,
		Command:         []string{installerPath, agentInImage, runtime.AgentPath},
		VolumeMounts:    []corev1.VolumeMount{{Name: agentVolume, MountPath: runtime.AgentDir}},
		Resources:       installResources(res),
		SecurityContext: &corev1.SecurityContext{
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			AllowPrivilegeEscalation: &no,
			Privileged:               &no,
			RunAsUser:                &nobody,
			RunAsGroup:               &nobody,
			RunAsNonRoot:             &yes,
			ReadOnlyRootFilesystem:   &yes,
			SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
	}
	// The agent: copied into an emptyDir by the init container, or, with
	// Config.AgentClaim, mounted from that claim with no init container.
	agentSource := corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}
	// The workspace: the sandbox's own claim, or its persistent
	// workspace's (volumes.go); other workspace volumes at their targets.
	workspace := corev1.PersistentVolumeClaimVolumeSource{ClaimName: claimName(name)}
	mounts := []corev1.VolumeMount{
		{Name: agentVolume, MountPath: runtime.AgentDir, ReadOnly: true},
		{Name: agentStateVolume, MountPath: runtime.AgentStateDir},
		{Name: workspaceVolume, MountPath: workDir},
	}
	var extra []corev1.Volume
	for i, m := range spec.Mounts {
		switch {
		case m.Type != runtime.MountVolume:
			// Create refuses host paths before it builds anything.
		case m.Target == workDir:
			workspace = corev1.PersistentVolumeClaimVolumeSource{ClaimName: m.Source, ReadOnly: m.ReadOnly}
			mounts[2].ReadOnly = m.ReadOnly
		default:
			vol := fmt.Sprintf("volume-%d", i)
			extra = append(extra, corev1.Volume{Name: vol, VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: m.Source, ReadOnly: m.ReadOnly}}})
			mounts = append(mounts, corev1.VolumeMount{Name: vol, MountPath: m.Target, ReadOnly: m.ReadOnly})
		}
	}
	main := corev1.Container{
		Name:            containerName,
		Image:           spec.Image,
		ImagePullPolicy: r.cfg.ImagePullPolicy,
		Command: runtime.AgentCommand{WorkDir: spec.AgentWorkDir(workDir), KeepWorkDirOwner: spec.WorkDir != "", User: spec.User,
			DenyRootUser: spec.DenyRootUser, TokenInEnv: true, App: spec.App}.Args(),
		Env: env,
		Ports: []corev1.ContainerPort{
			{Name: "agent", ContainerPort: runtime.AgentPort, Protocol: corev1.ProtocolTCP},
			{Name: "envd", ContainerPort: runtime.EnvdPort, Protocol: corev1.ProtocolTCP},
		},
		VolumeMounts: []corev1.VolumeMount{
			{Name: agentVolume, MountPath: runtime.AgentDir, ReadOnly: true},
			{Name: agentStateVolume, MountPath: runtime.AgentStateDir},
			{Name: workspaceVolume, MountPath: workDir},
		},
		Resources:       corev1.ResourceRequirements{Requests: requests(res), Limits: limits(res)},
		SecurityContext: sc,
	}
	pod := &corev1.Pod{
		ObjectMeta: meta,
		Spec: corev1.PodSpec{
			NodeName:                      r.cfg.NodeName,
			RestartPolicy:                 corev1.RestartPolicyNever,
			ServiceAccountName:            r.cfg.ServiceAccount,
			AutomountServiceAccountToken:  &no,
			EnableServiceLinks:            &no,
			TerminationGracePeriodSeconds: &grace,
			SecurityContext: &corev1.PodSecurityContext{
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			InitContainers: []corev1.Container{install},
			Containers:     []corev1.Container{main},
			Volumes: []corev1.Volume{
				{Name: agentVolume, VolumeSource: agentSource},
				{Name: agentStateVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
				{Name: workspaceVolume, VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &workspace}},
			},
		},
	}
	pod.Spec.Volumes = append(pod.Spec.Volumes, extra...)
	if r.cfg.AgentClaim != "" {
		pod.Spec.InitContainers = nil
		pod.Spec.Volumes[0].VolumeSource = corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{
			ClaimName: r.cfg.AgentClaim, ReadOnly: true}}
	}
	return secret, pod
}

func secretRef(name, key string) *corev1.EnvVarSource {
	return &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: name}, Key: key}}
}

// mainStatus returns the status of the sandbox's container, nil before the
// kubelet reported one.
func mainStatus(pod *corev1.Pod) *corev1.ContainerStatus {
	for i := range pod.Status.ContainerStatuses {
		if pod.Status.ContainerStatuses[i].Name == containerName {
			return &pod.Status.ContainerStatuses[i]
		}
	}
	return nil
}

// podEndpoint is the address of pod's agent: its IP and runtime.AgentPort;
// "" while it has no IP.
func podEndpoint(pod *corev1.Pod) string {
	if pod.Status.PodIP == "" {
		return ""
	}
	return net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(runtime.AgentPort))
}

// sandboxOf translates a Pod into a Sandbox. The endpoint is the Pod's IP
// and the agent's port while its container runs.
func sandboxOf(pod *corev1.Pod) runtime.Sandbox {
	sb := runtime.Sandbox{
		ID:              pod.Name,
		Name:            pod.Name,
		State:           runtime.StateCreated,
		CreatedAt:       pod.CreationTimestamp.Time,
		DiskEnforcement: pod.Annotations[diskAnnotation],
	}
	sb.SetLabels(labelsOf(pod.ObjectMeta))
	for _, c := range pod.Spec.Containers {
		if c.Name == containerName {
			sb.Image = c.Image
		}
	}
	st := mainStatus(pod)
	switch {
	case st != nil && st.State.Terminated != nil:
		sb.State = runtime.StateExited
		sb.ExitCode = int(st.State.Terminated.ExitCode)
		sb.OOMKilled = st.State.Terminated.Reason == "OOMKilled"
	case pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded:
		sb.State = runtime.StateExited
	case st != nil && st.State.Running != nil && pod.DeletionTimestamp == nil:
		sb.State = runtime.StateRunning
		sb.Endpoint = podEndpoint(pod)
	case pod.DeletionTimestamp != nil:
		sb.State = runtime.StateExited
	}
	return sb
}
