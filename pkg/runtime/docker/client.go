package docker

import (
	"context"
	"io"

	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/events"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/api/types/system"
	"github.com/docker/docker/api/types/volume"
	"github.com/docker/docker/client"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Client is the subset of the Docker Engine API client the backend calls.
// *client.Client implements it; tests inject fakes that implement exactly
// this (Nomad's docker driver does the same).
type Client interface {
	// DaemonHost is the address the client talks to (for error hints).
	DaemonHost() string
	Ping(ctx context.Context) (types.Ping, error)
	// Info tells the storage driver (for the disk limit's enforcement).
	Info(ctx context.Context) (system.Info, error)

	ImageInspect(ctx context.Context, ref string, opts ...client.ImageInspectOption) (image.InspectResponse, error)

	NetworkList(ctx context.Context, opts network.ListOptions) ([]network.Summary, error)
	NetworkCreate(ctx context.Context, name string, opts network.CreateOptions) (network.CreateResponse, error)
	NetworkRemove(ctx context.Context, id string) error

	ContainerCreate(ctx context.Context, cfg *container.Config, hc *container.HostConfig, nc *network.NetworkingConfig, platform *ocispec.Platform, name string) (container.CreateResponse, error)
	CopyToContainer(ctx context.Context, id, dstPath string, content io.Reader, opts container.CopyToContainerOptions) error
	CopyFromContainer(ctx context.Context, id, srcPath string) (io.ReadCloser, container.PathStat, error)
	ContainerStatPath(ctx context.Context, id, path string) (container.PathStat, error)
	ContainerStart(ctx context.Context, id string, opts container.StartOptions) error
	ContainerInspect(ctx context.Context, id string) (container.InspectResponse, error)
	// ContainerInspectWithRaw with getSize measures the writable layer (Usage).
	ContainerInspectWithRaw(ctx context.Context, id string, getSize bool) (container.InspectResponse, []byte, error)
	ContainerList(ctx context.Context, opts container.ListOptions) ([]container.Summary, error)
	ContainerStop(ctx context.Context, id string, opts container.StopOptions) error
	ContainerRemove(ctx context.Context, id string, opts container.RemoveOptions) error
	ContainerPause(ctx context.Context, id string) error
	ContainerUnpause(ctx context.Context, id string) error
	ContainerLogs(ctx context.Context, id string, opts container.LogsOptions) (io.ReadCloser, error)
	// ContainerStatsOneShot reads a running container's figures (stats.go).
	ContainerStatsOneShot(ctx context.Context, id string) (container.StatsResponseReader, error)

	VolumeCreate(ctx context.Context, opts volume.CreateOptions) (volume.Volume, error)
	// VolumeInspect, VolumeList, VolumeRemove and DiskUsage serve the
	// workspace volumes (volumes.go).
	VolumeInspect(ctx context.Context, name string) (volume.Volume, error)
	VolumeList(ctx context.Context, opts volume.ListOptions) (volume.ListResponse, error)
	VolumeRemove(ctx context.Context, name string, force bool) error
	DiskUsage(ctx context.Context, opts types.DiskUsageOptions) (types.DiskUsage, error)

	Events(ctx context.Context, opts events.ListOptions) (<-chan events.Message, <-chan error)

	// ContainerCommit, ImageList, ImageHistory and ImageRemove serve the
	// snapshots (snapshot.go).
	ContainerCommit(ctx context.Context, id string, opts container.CommitOptions) (container.CommitResponse, error)
	ImageList(ctx context.Context, opts image.ListOptions) ([]image.Summary, error)
	ImageHistory(ctx context.Context, id string, opts ...client.ImageHistoryOption) ([]image.HistoryResponseItem, error)
	ImageRemove(ctx context.Context, id string, opts image.RemoveOptions) ([]image.DeleteResponse, error)
}

var _ Client = (*client.Client)(nil)

// NewClient returns a Docker client configured from the environment
// (DOCKER_HOST, DOCKER_TLS_VERIFY, DOCKER_CERT_PATH, DOCKER_API_VERSION) that
// negotiates the API version with the engine, so a newer client works with an
// older engine (e.g. Engine 20.10, API 1.41).
func NewClient() (*client.Client, error) {
	return client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
}
