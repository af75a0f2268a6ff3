package lease

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	bolt "go.etcd.io/bbolt"
)

// VolumeRecord is what the Manager keeps about a workspace volume beyond
// what the runtime stores: when it was last used. It outlives the lease
// records (which are purged after Config.Retention), so the volume
// retention counts from the real last use.
type VolumeRecord struct {
	// Name is the volume's name.
	Name string `json:"name"`
	// Owner and ConversationID are whose workspace it holds.
	Owner          string `json:"owner,omitempty"`
	ConversationID string `json:"conversation_id"`
	// LastUsedAt is when a lease using it last became ready or ended.
	LastUsedAt time.Time `json:"last_used_at"`
	// LastLeaseID is that lease.
	LastLeaseID string `json:"last_lease_id,omitempty"`
}

// VolumeStore is the optional part of a Store that keeps VolumeRecords
// durably. BoltStore implements it (bucket "volumes"); with a Store that
// does not, the records live in memory and a restart forgets them (the
// retention then counts from the volume's creation).
type VolumeStore interface {
	// PutVolume creates or replaces the record r.Name, durably.
	PutVolume(r VolumeRecord) error
	// DeleteVolume removes a record; a missing one is success.
	DeleteVolume(name string) error
	// ForEachVolume calls fn for every record until fn returns an error.
	ForEachVolume(fn func(VolumeRecord) error) error
}

var _ VolumeStore = (*BoltStore)(nil)

var bucketVolumes = []byte("volumes")

// PutVolume implements VolumeStore.
func (s *BoltStore) PutVolume(r VolumeRecord) error {
	if r.Name == "" {
		return errdefs.InvalidArgument("name", "volume name is empty")
	}
	b, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("%w: lease store: encode volume %s: %v", errdefs.ErrInternal, r.Name, err)
	}
	err = s.db.Update(func(tx *bolt.Tx) error {
		bk, err := tx.CreateBucketIfNotExists(bucketVolumes)
		if err != nil {
			return err
		}
		return bk.Put([]byte(r.Name), b)
	})
	if err != nil {
		return fmt.Errorf("%w: lease store: put volume %s: %v", errdefs.ErrUnavailable, r.Name, err)
	}
	return nil
}

// DeleteVolume implements VolumeStore.
func (s *BoltStore) DeleteVolume(name string) error {
	err := s.db.Update(func(tx *bolt.Tx) error {
		bk := tx.Bucket(bucketVolumes)
		if bk == nil {
			return nil
		}
		return bk.Delete([]byte(name))
	})
	if err != nil {
		return fmt.Errorf("%w: lease store: delete volume %s: %v", errdefs.ErrUnavailable, name, err)
	}
	return nil
}

// ForEachVolume implements VolumeStore.
func (s *BoltStore) ForEachVolume(fn func(VolumeRecord) error) error {
	return s.db.View(func(tx *bolt.Tx) error {
		bk := tx.Bucket(bucketVolumes)
		if bk == nil {
			return nil
		}
		return bk.ForEach(func(k, v []byte) error {
			var r VolumeRecord
			if err := json.Unmarshal(v, &r); err != nil {
				return fmt.Errorf("lease store: decode volume %s: %w", k, err)
			}
			return fn(r)
		})
	})
}
