package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/lease"
	"github.com/berth-dev/berth/pkg/runtime"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// volumeServer is the gRPC adapter of VolumeService over the lease
// manager's volumes. The operator sees and removes every owner's volumes;
// a client token only its own owner's (another owner's volume is
// NOT_FOUND, so its existence is not revealed); a lease token nothing.
type volumeServer struct {
	orchv1.UnimplementedVolumeServiceServer
	vols lease.Volumes
}

// volumeOwner returns the owner the caller is limited to ("" for the
// operator: any), or PERMISSION_DENIED for a lease token.
func volumeOwner(p Principal) (string, error) {
	switch p.Role {
	case RoleOperator:
		return "", nil
	case RoleClient:
		return p.Owner, nil
	}
	return "", errdefs.Newf(errdefs.ErrPermissionDenied, "volumes need the operator token or a client token")
}

// List implements VolumeService.List.
func (s *volumeServer) List(ctx context.Context, req *orchv1.ListVolumesRequest) (*orchv1.ListVolumesResponse, error) {
	owner, err := volumeOwner(principal(ctx))
	if err != nil {
		return nil, err
	}
	f := lease.VolumeFilter{Owner: req.Owner, ConversationID: req.ConversationId}
	if owner != "" {
		if req.Owner != "" && req.Owner != owner {
			return nil, errdefs.Newf(errdefs.ErrPermissionDenied, "owner: a client token lists only its own volumes")
		}
		f.Owner = owner
	}
	vols, err := s.vols.List(ctx, f)
	if err != nil {
		return nil, err
	}
	out := &orchv1.ListVolumesResponse{Volumes: make([]*orchv1.Volume, 0, len(vols))}
	for _, v := range vols {
		out.Volumes = append(out.Volumes, toVolume(v))
	}
	return out, nil
}

// lookup returns a volume the caller may see; others are NOT_FOUND.
func (s *volumeServer) lookup(ctx context.Context, name string) (lease.VolumeInfo, error) {
	owner, err := volumeOwner(principal(ctx))
	if err != nil {
		return lease.VolumeInfo{}, err
	}
	if name == "" {
		return lease.VolumeInfo{}, errdefs.Newf(errdefs.ErrInvalidArgument, "name: required")
	}
	if !runtime.ValidVolumeName(name) {
		return lease.VolumeInfo{}, errdefs.Newf(errdefs.ErrInvalidArgument, "name: %q is not a volume name", name)
	}
	v, err := s.vols.Inspect(ctx, name)
	if err != nil {
		return v, err
	}
	if owner != "" && v.Owner != owner {
		return lease.VolumeInfo{}, errdefs.Newf(errdefs.ErrNotFound, "volume %s not found", name)
	}
	return v, nil
}

// Get implements VolumeService.Get.
func (s *volumeServer) Get(ctx context.Context, req *orchv1.GetVolumeRequest) (*orchv1.Volume, error) {
	v, err := s.lookup(ctx, req.Name)
	if err != nil {
		return nil, err
	}
	return toVolume(v), nil
}

// Delete implements VolumeService.Delete.
func (s *volumeServer) Delete(ctx context.Context, req *orchv1.DeleteVolumeRequest) (*orchv1.DeleteVolumeResponse, error) {
	if _, err := s.lookup(ctx, req.Name); err != nil {
		return nil, err
	}
	if err := s.vols.Remove(ctx, req.Name); err != nil {
		return nil, err
	}
	return &orchv1.DeleteVolumeResponse{}, nil
}

// toVolume converts a volume for the wire.
func toVolume(v lease.VolumeInfo) *orchv1.Volume {
	return &orchv1.Volume{Name: v.Name, Owner: v.Owner, ConversationId: v.ConversationID, SizeBytes: v.SizeBytes,
		CreatedAt: ts(v.CreatedAt), LastUsedAt: ts(v.LastUsedAt), InUse: v.InUse(), LeaseId: v.LeaseID}
}

// fromHostMounts converts an acquire's host mounts.
func fromHostMounts(ms []*orchv1.HostMount) []lease.HostMount {
	var out []lease.HostMount
	for _, m := range ms {
		if m == nil {
			continue
		}
		out = append(out, lease.HostMount{HostPath: m.HostPath, Target: m.Target, ReadOnly: m.ReadOnly})
	}
	return out
}

// setLeaseMounts fills a wire lease's workspace and mounts.
func setLeaseMounts(out *orchv1.Lease, l lease.Lease) {
	out.Workspace = &orchv1.Workspace{Persist: l.Volume != "", Volume: l.Volume}
	for _, m := range l.Mounts {
		out.Mounts = append(out.Mounts, &orchv1.HostMount{HostPath: m.Source, Target: m.Target, ReadOnly: m.ReadOnly})
	}
}

// defaultVolumes is Defaults' Volumes: the lease manager's defaults,
// but a service keeps an unused workspace 30 days (the library: until
// removed) and 50 per owner (the library: no limit).
func defaultVolumes() lease.VolumeConfig {
	v := lease.DefaultVolumeConfig()
	v.Retention = 30 * 24 * time.Hour
	v.MaxPerOwner = 50
	return v
}

// leaseVolumes is the lease manager's VolumeConfig: Config.Volumes with
// the host mounts of Config.AllowHostMounts (checked by Validate) added.
func leaseVolumes(c Config) lease.VolumeConfig {
	v := c.Volumes
	p, _ := runtime.ParseHostMountPolicy(c.AllowHostMounts)
	v.HostMounts = append(slices.Clone(v.HostMounts), p...)
	return v
}

// validateVolumes checks the volume and host mount settings.
func (c Config) validateVolumes() error {
	if err := c.Volumes.Validate(); err != nil {
		return err
	}
	p, err := runtime.ParseHostMountPolicy(c.AllowHostMounts)
	if err != nil {
		return fmt.Errorf("allow host mounts: %w", err)
	}
	if len(p) > 0 && c.Runtime == "kubernetes" {
		return errors.New("allow host mounts: the kubernetes runtime cannot mount host paths (a Pod under Pod Security baseline has no hostPath volume)")
	}
	return nil
}
