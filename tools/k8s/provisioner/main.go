// Command provisioner is the test cluster's storage provisioner (make
// k8s-up): it gives every PersistentVolumeClaim of its StorageClass a
// hostPath PersistentVolume on the node, a new directory of mode 0777 under
// -dir, pre-bound to the claim (claimRef); kube-controller-manager's binder
// completes the binding. When a claim is deleted its volume is Released:
// the provisioner removes the directory and the volume (reclaim policy
// Delete). One node, one process on that node: this is what a real
// cluster's CSI driver and external-provisioner do, reduced to a test
// cluster's needs. It watches claims and volumes (informers: a claim is
// provisioned as soon as it is created, not at the next poll) and looks
// again every -every for what an event may have missed; it logs to
// stderr.
//
//	provisioner -kubeconfig FILE -class berth-local -dir /var/lib/berth-k8s/volumes
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

// provisionedBy labels the volumes this program made.
const provisionedBy = "berth.dev/provisioned-by"

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig file (an identity that may manage PersistentVolumes)")
	class := flag.String("class", "berth-local", "the StorageClass whose claims this provisioner serves")
	dir := flag.String("dir", "/var/lib/berth-k8s/volumes", "the node directory holding the volumes")
	every := flag.Duration("every", 5*time.Second, "how often to look again for new claims and released volumes (their events trigger a look at once)")
	flag.Parse()
	rc, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		log.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		log.Fatal(err)
	}
	if err := os.MkdirAll(*dir, 0o700); err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	factory := informers.NewSharedInformerFactory(cs, 0)
	claimInf, volInf := factory.Core().V1().PersistentVolumeClaims(), factory.Core().V1().PersistentVolumes()
	kick := make(chan struct{}, 1)
	poke := func(any) {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	for _, inf := range []cache.SharedIndexInformer{claimInf.Informer(), volInf.Informer()} {
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: poke, UpdateFunc: func(_, o any) { poke(o) }, DeleteFunc: poke,
		}); err != nil {
			log.Fatal(err)
		}
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), claimInf.Informer().HasSynced, volInf.Informer().HasSynced) {
		return
	}
	p := &provisioner{cs: cs, class: *class, dir: *dir, claims: claimInf.Lister(), volumes: volInf.Lister()}
	for ctx.Err() == nil {
		if err := p.sync(ctx); err != nil && ctx.Err() == nil {
			log.Printf("sync: %v", err)
		}
		select {
		case <-ctx.Done():
		case <-kick:
		case <-time.After(*every):
		}
	}
}

type provisioner struct {
	cs      kubernetes.Interface
	class   string
	dir     string
	claims  corelisters.PersistentVolumeClaimLister
	volumes corelisters.PersistentVolumeLister
}

// sync provisions a volume for each pending claim of the class and deletes
// the released volumes it made.
func (p *provisioner) sync(ctx context.Context) error {
	claims, err := p.claims.List(labels.Everything())
	if err != nil {
		return err
	}
	for _, c := range claims {
		if c.Spec.StorageClassName == nil || *c.Spec.StorageClassName != p.class ||
			c.Spec.VolumeName != "" || c.Status.Phase != corev1.ClaimPending || c.DeletionTimestamp != nil {
			continue
		}
		if err := p.provision(ctx, c); err != nil {
			log.Printf("provision %s/%s: %v", c.Namespace, c.Name, err)
		}
	}
	vols, err := p.volumes.List(labels.SelectorFromSet(labels.Set{provisionedBy: p.class}))
	if err != nil {
		return err
	}
	for _, v := range vols {
		if v.Status.Phase != corev1.VolumeReleased && v.Status.Phase != corev1.VolumeFailed {
			continue
		}
		if err := p.delete(ctx, v); err != nil {
			log.Printf("delete %s: %v", v.Name, err)
		}
	}
	return nil
}

func (p *provisioner) volumeName(c *corev1.PersistentVolumeClaim) string {
	return "pvc-" + string(c.UID)
}

func (p *provisioner) provision(ctx context.Context, c *corev1.PersistentVolumeClaim) error {
	name := p.volumeName(c)
	path := filepath.Join(p.dir, name)
	if err := os.MkdirAll(path, 0o777); err != nil {
		return err
	}
	// Any user of any image may write the workspace (like an emptyDir).
	if err := os.Chmod(path, 0o777); err != nil {
		return err
	}
	dirType := corev1.HostPathDirectory
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Labels:      map[string]string{provisionedBy: p.class},
			Annotations: map[string]string{"pv.kubernetes.io/provisioned-by": "berth.dev/k8s-test-provisioner"},
		},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: c.Spec.Resources.Requests[corev1.ResourceStorage]},
			AccessModes:                   c.Spec.AccessModes,
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			StorageClassName:              p.class,
			ClaimRef: &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1",
				Namespace: c.Namespace, Name: c.Name, UID: c.UID},
			PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path, Type: &dirType}},
		},
	}
	_, err := p.cs.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	if err == nil {
		log.Printf("provisioned %s for %s/%s", name, c.Namespace, c.Name)
	}
	return err
}

func (p *provisioner) delete(ctx context.Context, v *corev1.PersistentVolume) error {
	if v.Spec.HostPath == nil || !strings.HasPrefix(v.Spec.HostPath.Path, p.dir+string(filepath.Separator)) {
		return fmt.Errorf("not under %s", p.dir)
	}
	if err := os.RemoveAll(v.Spec.HostPath.Path); err != nil {
		return err
	}
	err := p.cs.CoreV1().PersistentVolumes().Delete(ctx, v.Name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	log.Printf("deleted %s", v.Name)
	return nil
}
