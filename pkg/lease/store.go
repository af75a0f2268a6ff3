package lease

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// Store persists lease records. The Manager is the only writer; it keeps
// every record in memory and writes through, so a Store only needs to be
// durable, not fast to query. Implementations must be safe for concurrent use.
type Store interface {
	// Put creates or replaces the record l.ID, durably, before returning.
	Put(l Lease) error
	// PutAll puts every record in one atomic, durable write (all or none).
	PutAll(ls []Lease) error
	// Get returns one record; an error wrapping errdefs.ErrNotFound if absent.
	Get(id string) (Lease, error)
	// Delete removes records in one atomic, durable write; deleting a
	// missing record is success.
	Delete(ids ...string) error
	// ForEach calls fn for every record, in id order, until fn returns an
	// error, which ForEach returns. fn must not call the Store.
	ForEach(fn func(Lease) error) error
}

// DBFileName is the name of the lease database inside the data directory.
const DBFileName = "leases.db"

// schemaVersion is written to the meta bucket; a file with a newer version
// is refused so an old binary cannot corrupt it.
const schemaVersion = "1"

var (
	bucketLeases = []byte("leases")
	bucketMeta   = []byte("meta")
	keySchema    = []byte("schema")
)

// BoltStore is the embedded Store: one bbolt file holding a bucket per kind
// ("leases": id → JSON Lease; "meta": schema version). Every write is a
// bbolt transaction fsync'd before Put, PutAll or Delete returns.
type BoltStore struct {
	db *bolt.DB
}

var _ Store = (*BoltStore)(nil)

// OpenBolt opens (creating it and its directory if needed) the bbolt file at
// path, usually filepath.Join(dataDir, DBFileName). The file is created with
// mode 0600 and locked: a second process opening it gets an error wrapping
// errdefs.ErrUnavailable after one second instead of hanging. Close it when
// done.
func OpenBolt(path string) (*BoltStore, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("lease store: %w", err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		if errors.Is(err, bolterrors.ErrTimeout) {
			return nil, errdefs.Unavailable("lease store %s is locked by another process (is another orchestrator running on this data dir?)", path)
		}
		return nil, fmt.Errorf("lease store: open %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		if _, err := tx.CreateBucketIfNotExists(bucketLeases); err != nil {
			return err
		}
		meta, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		switch v := meta.Get(keySchema); {
		case v == nil:
			return meta.Put(keySchema, []byte(schemaVersion))
		case string(v) != schemaVersion:
			return errdefs.FailedPrecondition("lease store %s has schema version %s; this build understands %s", path, v, schemaVersion)
		}
		return nil
	})
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("lease store: init %s: %w", path, err)
	}
	return &BoltStore{db: db}, nil
}

// Put implements Store.
func (s *BoltStore) Put(l Lease) error {
	if l.ID == "" {
		return errdefs.InvalidArgument("id", "lease id is empty")
	}
	b, err := json.Marshal(l)
	if err != nil {
		return fmt.Errorf("%w: lease store: encode lease %s: %v", errdefs.ErrInternal, l.ID, err)
	}
	err = s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketLeases).Put([]byte(l.ID), b)
	})
	if err != nil {
		return fmt.Errorf("%w: lease store: put lease %s: %v", errdefs.ErrUnavailable, l.ID, err)
	}
	return nil
}

// PutAll implements Store: one transaction, one fsync.
func (s *BoltStore) PutAll(ls []Lease) error {
	vals := make([][]byte, len(ls))
	for i, l := range ls {
		if l.ID == "" {
			return errdefs.InvalidArgument("id", "lease id is empty")
		}
		b, err := json.Marshal(l)
		if err != nil {
			return fmt.Errorf("%w: lease store: encode lease %s: %v", errdefs.ErrInternal, l.ID, err)
		}
		vals[i] = b
	}
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketLeases)
		for i, l := range ls {
			if err := b.Put([]byte(l.ID), vals[i]); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("%w: lease store: put %d leases: %v", errdefs.ErrUnavailable, len(ls), err)
	}
	return nil
}

// Get implements Store.
func (s *BoltStore) Get(id string) (Lease, error) {
	var l Lease
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketLeases).Get([]byte(id))
		if v == nil {
			return errdefs.NotFound("lease %s", id)
		}
		return decodeLease(id, v, &l)
	})
	return l, err
}

// Delete implements Store.
func (s *BoltStore) Delete(ids ...string) error {
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketLeases)
		for _, id := range ids {
			if err := b.Delete([]byte(id)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("%w: lease store: delete leases %v: %v", errdefs.ErrUnavailable, ids, err)
	}
	return nil
}

// ForEach implements Store.
func (s *BoltStore) ForEach(fn func(Lease) error) error {
	return s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketLeases).ForEach(func(k, v []byte) error {
			var l Lease
			if err := decodeLease(string(k), v, &l); err != nil {
				return err
			}
			return fn(l)
		})
	})
}

// Close closes the file. The store must not be used afterwards.
func (s *BoltStore) Close() error { return s.db.Close() }

func decodeLease(id string, v []byte, l *Lease) error {
	if err := json.Unmarshal(v, l); err != nil {
		return fmt.Errorf("%w: lease store: decode lease %s: %v", errdefs.ErrInternal, id, err)
	}
	return nil
}
