// Package kubestore is the lease store held in a Kubernetes cluster: a
// lease.SharedStore, so that several orchestrator replicas serve one fleet
// (docs/kubernetes.md).
//
// # Object layout
//
// Every lease record is a BerthLease (berthleases.berth.dev/v1alpha1, the
// CustomResourceDefinition of deploy/kubernetes/crd-berthleases.yaml) in
// the orchestrator's namespace:
//
//	apiVersion: berth.dev/v1alpha1
//	kind: BerthLease
//	metadata:
//	  name: <lease id>                  # 26 chars of [0-9a-v]: a DNS name
//	  labels:
//	    app.kubernetes.io/managed-by: berth
//	    berth.dev/fleet: default        # Config.Fleet
//	    berth.dev/state: READY          # the record's state
//	    berth.dev/instance: <home>      # lease.Lease.Instance, when it is a valid label value
//	  annotations:
//	    berth.dev/writer: <instance>    # the replica that wrote it last
//	spec:
//	  record: {...}                     # lease.Lease as JSON, field for field
//
// spec.record is the JSON document the single-replica bbolt store keeps
// (x-kubernetes-preserve-unknown-fields: the CRD does not repeat the
// fields of lease.Lease, so a new field needs no new CRD). The labels
// exist for people and selectors (kubectl get bl -l berth.dev/state=READY);
// the store reads spec.record, the writer annotation and the fleet label:
// a Store lists, watches and gets only its fleet's records, so that
// several fleets (orchestrator --fleet) share a namespace apart.
//
// The conversation lock of a (owner, conversation) pair is a
// coordination.k8s.io/v1 Lease named berth-conv-<first 40 hex digits of
// sha256(owner "\x00" conversation)> in the default fleet (of
// sha256(fleet "\x00" owner "\x00" conversation) in another: FleetLockName),
// whose spec.holderIdentity is the lease id holding it, labelled
// app.kubernetes.io/managed-by=berth, berth.dev/kind=conversation-lock and
// berth.dev/fleet. The API server's create-if-absent
// (AlreadyExists) and compare-and-swap on resourceVersion make the lock:
// no lease duration is used, a lock is held until it is released or taken
// over (lease.SharedStore.TakeConversation).
//
// # Why a CustomResourceDefinition
//
// A CRD rather than ConfigMaps: `kubectl get berthleases` (short name bl)
// shows the fleet with its state, owner, conversation and home replica;
// the orchestrator's Role is granted exactly one resource
// (berth.dev/berthleases) instead of every ConfigMap of the namespace; and
// the objects are typed, so nothing else mistakes them for configuration.
// The records carry lease.Lease.Env (user data, see lease.Lease): whoever
// may read berthleases in the namespace may read it.
//
// # Consistency
//
// Writes go to the API server (Put is a create, or an update carrying the
// resourceVersion last seen, retried on Conflict: last writer wins). Get
// and ForEach read from the API server, not the informer's cache, so they
// see every write that returned. Subscribe is fed by one informer (a
// list and a watch of the namespace's BerthLeases) that New starts and
// syncs; it leaves out the records this replica wrote last (the writer
// annotation) and the deletions it made itself.
package kubestore
