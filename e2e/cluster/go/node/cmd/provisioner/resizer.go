package main

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
)

// resizer grows the claims bound to this provisioner's volumes. A hostPath volume is a
// directory with no size of its own, so the storage side of a resize has nothing to do:
// what is left is what an external-resizer writes once the storage answered — the
// PersistentVolume's capacity, then the claim's status.capacity. No file system step
// follows (no FileSystemResizePending): the kubelet mounts the same directory.
type resizer struct {
	client kubernetes.Interface
	root   string
	claims cache.Indexer
	queue  workqueue.TypedRateLimitingInterface[string]
}

func runResizer(ctx context.Context, client kubernetes.Interface, root string) {
	factory := informers.NewSharedInformerFactory(client, 5*time.Minute)
	informer := factory.Core().V1().PersistentVolumeClaims().Informer()
	r := &resizer{
		client: client,
		root:   root,
		claims: informer.GetIndexer(),
		queue: workqueue.NewTypedRateLimitingQueue(
			workqueue.DefaultTypedControllerRateLimiter[string]()),
	}
	enqueue := func(obj interface{}) {
		if key, err := cache.MetaNamespaceKeyFunc(obj); err == nil {
			r.queue.Add(key)
		}
	}
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj interface{}) { enqueue(obj) },
	}); err != nil {
		klog.Fatalf("resizer: watching claims: %v", err)
	}
	factory.Start(ctx.Done())
	cache.WaitForCacheSync(ctx.Done(), informer.HasSynced)
	klog.Info("resizer: watching claims for growth of volumes below ", root)
	go func() {
		<-ctx.Done()
		r.queue.ShutDown()
	}()
	for r.next(ctx) {
	}
}

func (r *resizer) next(ctx context.Context) bool {
	key, shutdown := r.queue.Get()
	if shutdown {
		return false
	}
	defer r.queue.Done(key)
	if err := r.sync(ctx, key); err != nil {
		klog.Warningf("resizer: claim %s: %v (retrying)", key, err)
		r.queue.AddRateLimited(key)
		return true
	}
	r.queue.Forget(key)
	return true
}

func (r *resizer) sync(ctx context.Context, key string) error {
	obj, exists, err := r.claims.GetByKey(key)
	if err != nil || !exists {
		return err
	}
	claim := obj.(*v1.PersistentVolumeClaim)
	want, asked := claim.Spec.Resources.Requests[v1.ResourceStorage]
	have := claim.Status.Capacity[v1.ResourceStorage]
	if claim.Status.Phase != v1.ClaimBound || claim.Spec.VolumeName == "" || !asked ||
		want.Cmp(have) <= 0 {
		return nil
	}
	pvs := r.client.CoreV1().PersistentVolumes()
	pv, err := pvs.Get(ctx, claim.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("volume %s: %w", claim.Spec.VolumeName, err)
	}
	if pv.Spec.HostPath == nil || filepath.Dir(pv.Spec.HostPath.Path) != r.root {
		return nil // not a volume this provisioner made
	}
	if current := pv.Spec.Capacity[v1.ResourceStorage]; want.Cmp(current) > 0 {
		pv = pv.DeepCopy()
		pv.Spec.Capacity[v1.ResourceStorage] = want
		if _, err := pvs.Update(ctx, pv, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("volume %s capacity to %s: %w", pv.Name, want.String(), err)
		}
	}
	grown := claim.DeepCopy()
	if grown.Status.Capacity == nil {
		grown.Status.Capacity = v1.ResourceList{}
	}
	grown.Status.Capacity[v1.ResourceStorage] = want
	if grown.Status.AllocatedResources == nil {
		grown.Status.AllocatedResources = v1.ResourceList{}
	}
	grown.Status.AllocatedResources[v1.ResourceStorage] = want
	delete(grown.Status.AllocatedResourceStatuses, v1.ResourceStorage)
	kept := grown.Status.Conditions[:0]
	for _, c := range grown.Status.Conditions {
		if c.Type != v1.PersistentVolumeClaimResizing && c.Type != v1.PersistentVolumeClaimFileSystemResizePending {
			kept = append(kept, c)
		}
	}
	grown.Status.Conditions = kept
	if _, err := r.client.CoreV1().PersistentVolumeClaims(claim.Namespace).UpdateStatus(
		ctx, grown, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("status.capacity to %s: %w", want.String(), err)
	}
	klog.Infof("resizer: claim %s and volume %s grown from %s to %s", key, pv.Name,
		have.String(), want.String())
	return nil
}
