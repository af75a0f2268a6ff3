package files

import (
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"

	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
)

// Codec is the gRPC codec of a server with the FileService: gRPC's
// protobuf codec, except for the data messages of an upload stream
// (UploadRequest and UploadArchiveRequest that carry a chunk of at most
// 1 MiB and nothing else). Their chunk is copied once, straight from the
// received frames into a pooled block, which the upload hands back to the
// pool once it has written and hashed it; the protobuf codec would gather
// the frames into one buffer, then copy the chunk again into a new,
// zeroed allocation per message. Install it with grpc.ForceServerCodecV2.
type Codec struct {
	encoding.CodecV2
}

// NewCodec returns the codec.
func NewCodec() Codec { return Codec{encoding.GetCodecV2(proto.Name)} }

// Unmarshal decodes data into v (see Codec).
func (c Codec) Unmarshal(data mem.BufferSlice, v any) error {
	switch m := v.(type) {
	case *agentv1.UploadRequest:
		if chunk := decodeChunk(data); chunk != nil {
			m.Reset()
			m.Msg = &agentv1.UploadRequest_Chunk{Chunk: chunk}
			return nil
		}
	case *agentv1.UploadArchiveRequest:
		if chunk := decodeChunk(data); chunk != nil {
			m.Reset()
			m.Msg = &agentv1.UploadArchiveRequest_Chunk{Chunk: chunk}
			return nil
		}
	}
	return c.CodecV2.Unmarshal(data, v)
}

// chunkField is the field number of the chunk in both upload messages.
const chunkField = 2

// decodeChunk returns the chunk of an upload message that holds a
// non-empty chunk of at most uploadBlock bytes and no other field, in a
// block from the pool; otherwise nil, for the protobuf codec to decode.
func decodeChunk(data mem.BufferSlice) []byte {
	total := data.Len()
	if total <= 2 || total > uploadBlock+2*binaryMaxVarintLen {
		return nil
	}
	// The tag and the length come first, within a few bytes that may span
	// buffers.
	var head [1 + binaryMaxVarintLen]byte
	hn := copyFrom(data, 0, head[:])
	num, typ, tn := protowire.ConsumeTag(head[:hn])
	if tn < 0 || num != chunkField || typ != protowire.BytesType {
		return nil
	}
	l, ln := protowire.ConsumeVarint(head[tn:hn])
	off := tn + ln
	if ln < 0 || l == 0 || l > uploadBlock || uint64(total-off) != l {
		return nil
	}
	bp := getBlock()
	chunk := (*bp)[:l]
	copyFrom(data, off, chunk)
	return chunk
}

// binaryMaxVarintLen is the longest a varint encoding of a 64-bit value
// can be.
const binaryMaxVarintLen = 10

// copyFrom copies data from offset off into dst and returns the bytes
// copied.
func copyFrom(data mem.BufferSlice, off int, dst []byte) int {
	n := 0
	for _, b := range data {
		src := b.ReadOnlyData()
		if off >= len(src) {
			off -= len(src)
			continue
		}
		n += copy(dst[n:], src[off:])
		off = 0
		if n == len(dst) {
			break
		}
	}
	return n
}

// chunkBlock returns the chunk c of an upload stream as a pool block, when
// its capacity is a block's: decodeChunk's blocks go back to the pool that
// way. A chunk the protobuf codec allocated may go too: every chunk is its
// upload's alone (nothing else holds the message it came in), so nothing
// else can see the buffer again. Otherwise nil.
func chunkBlock(c []byte) *[]byte {
	if cap(c) != uploadBlock {
		return nil
	}
	b := c[:uploadBlock]
	return &b
}
