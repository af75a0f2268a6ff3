package files

import (
	"bytes"
	"testing"

	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// split cuts b into buffers of the given sizes (the rest in the last), as
// frames arrive.
func split(b []byte, sizes ...int) mem.BufferSlice {
	var s mem.BufferSlice
	for _, n := range sizes {
		n = min(n, len(b))
		s = append(s, mem.SliceBuffer(b[:n]))
		b = b[n:]
	}
	return append(s, mem.SliceBuffer(b))
}

func TestCodecUnmarshal(t *testing.T) {
	c := NewCodec()
	chunk := func(n int) []byte { return bytes.Repeat([]byte{0xab}, n) }
	marshal := func(m proto.Message) []byte {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	withUnknown := protowire.AppendTag(marshal(&agentv1.UploadRequest{Msg: &agentv1.UploadRequest_Chunk{Chunk: chunk(10)}}), 9, protowire.VarintType)
	withUnknown = protowire.AppendVarint(withUnknown, 1)
	cases := []struct {
		name   string
		wire   []byte
		pooled bool // decoded by decodeChunk rather than the protobuf codec
	}{
		{"chunk", marshal(&agentv1.UploadRequest{Msg: &agentv1.UploadRequest_Chunk{Chunk: chunk(100 << 10)}}), true},
		{"one byte", marshal(&agentv1.UploadRequest{Msg: &agentv1.UploadRequest_Chunk{Chunk: chunk(1)}}), true},
		{"a block", marshal(&agentv1.UploadRequest{Msg: &agentv1.UploadRequest_Chunk{Chunk: chunk(uploadBlock)}}), true},
		{"beyond a block", marshal(&agentv1.UploadRequest{Msg: &agentv1.UploadRequest_Chunk{Chunk: chunk(uploadBlock + 1)}}), false},
		{"empty chunk", marshal(&agentv1.UploadRequest{Msg: &agentv1.UploadRequest_Chunk{Chunk: []byte{}}}), false},
		{"header", marshal(&agentv1.UploadRequest{Msg: &agentv1.UploadRequest_Header{Header: &agentv1.UploadHeader{Path: "/a", Mode: 0o600}}}), false},
		{"chunk and an unknown field", withUnknown, false},
		{"empty message", nil, false},
	}
	for _, tc := range cases {
		want := &agentv1.UploadRequest{}
		if err := proto.Unmarshal(tc.wire, want); err != nil {
			t.Fatal(err)
		}
		// Every way of cutting the first bytes across buffers.
		for cut := 0; cut <= 4; cut++ {
			for _, data := range []mem.BufferSlice{split(tc.wire, cut), split(tc.wire, cut, 1, 1, 3, 16384)} {
				got := &agentv1.UploadRequest{}
				if err := c.Unmarshal(data, got); err != nil {
					t.Fatalf("%s: %v", tc.name, err)
				}
				if !proto.Equal(got, want) {
					t.Fatalf("%s (cut %d): decoded %v, want %v", tc.name, cut, got, want)
				}
				if tc.pooled && cap(got.GetChunk()) != uploadBlock {
					t.Fatalf("%s: chunk not decoded into a block (cap %d)", tc.name, cap(got.GetChunk()))
				}
			}
		}
	}

	// The archive's upload message too.
	wire := marshal(&agentv1.UploadArchiveRequest{Msg: &agentv1.UploadArchiveRequest_Chunk{Chunk: chunk(5000)}})
	got := &agentv1.UploadArchiveRequest{}
	if err := c.Unmarshal(split(wire, 2), got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.GetChunk(), chunk(5000)) || cap(got.GetChunk()) != uploadBlock {
		t.Fatalf("archive chunk: %d bytes, cap %d", len(got.GetChunk()), cap(got.GetChunk()))
	}
	// Other messages go to the protobuf codec.
	sreq := &agentv1.StatRequest{}
	if err := c.Unmarshal(split(marshal(&agentv1.StatRequest{Path: "/x"}), 1), sreq); err != nil || sreq.GetPath() != "/x" {
		t.Fatalf("StatRequest: %v, %v", sreq, err)
	}
}
