// Command provisioner is the test cluster's dynamic volume provisioner, on the library
// external provisioners are written with (sigs.k8s.io/sig-storage-lib-external-provisioner).
// Every claim of its StorageClass gets a hostPath PersistentVolume: a directory below
// -dir, mode 0777 because hostPath volumes get no fsGroup and the replicas run as a
// non-root user. Deleting the volume (reclaim policy Delete) removes the directory.
// Growing a claim is the resizer's (resizer.go): its StorageClass must allow expansion.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v11/controller"
)

type hostPathProvisioner struct{ root string }

func (p *hostPathProvisioner) Provision(_ context.Context, opts controller.ProvisionOptions) (*v1.PersistentVolume, controller.ProvisioningState, error) {
	dir := filepath.Join(p.root, opts.PVName)
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return nil, controller.ProvisioningFinished, fmt.Errorf("volume directory %s: %w", dir, err)
	}
	// MkdirAll's mode is filtered by the umask; the replicas' user must be able to write.
	if err := os.Chmod(dir, 0o777); err != nil {
		return nil, controller.ProvisioningFinished, fmt.Errorf("volume directory %s: %w", dir, err)
	}
	reclaim := v1.PersistentVolumeReclaimDelete
	if opts.StorageClass.ReclaimPolicy != nil {
		reclaim = *opts.StorageClass.ReclaimPolicy
	}
	return &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: opts.PVName},
		Spec: v1.PersistentVolumeSpec{
			PersistentVolumeReclaimPolicy: reclaim,
			AccessModes:                   opts.PVC.Spec.AccessModes,
			Capacity:                      v1.ResourceList{v1.ResourceStorage: opts.PVC.Spec.Resources.Requests[v1.ResourceStorage]},
			PersistentVolumeSource: v1.PersistentVolumeSource{
				HostPath: &v1.HostPathVolumeSource{Path: dir},
			},
		},
	}, controller.ProvisioningFinished, nil
}

func (p *hostPathProvisioner) Delete(_ context.Context, pv *v1.PersistentVolume) error {
	// Only ever remove a directory this provisioner made.
	if pv.Spec.HostPath == nil || filepath.Dir(pv.Spec.HostPath.Path) != p.root {
		return fmt.Errorf("volume %s is not below %s: not deleting it", pv.Name, p.root)
	}
	return os.RemoveAll(pv.Spec.HostPath.Path)
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the provisioner's identity")
	root := flag.String("dir", "", "directory the volumes are made in")
	name := flag.String("name", "", "provisioner name (the StorageClass's provisioner field)")
	klog.InitFlags(nil)
	flag.Parse()
	if *root == "" || *name == "" {
		klog.Fatal("-dir and -name are required")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		klog.Fatalf("kubeconfig %q: %v", *kubeconfig, err)
	}
	abs, err := filepath.Abs(*root)
	if err != nil {
		klog.Fatalf("-dir %q: %v", *root, err)
	}
	ctx := context.Background()
	client := kubernetes.NewForConfigOrDie(cfg)
	go runResizer(ctx, client, abs)
	controller.NewProvisionController(
		ctx, client, *name, &hostPathProvisioner{root: abs},
		controller.LeaderElection(false),
	).Run(ctx)
}
