package edge

import (
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"strings"
	"unicode"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
)

// namingJSONPb is grpc-gateway's JSONPb whose request decoding names the
// field of a malformed duration: protojson's own message ("invalid
// google.protobuf.Duration value \"10m\"") names neither the field nor the
// accepted form.
type namingJSONPb struct {
	*runtime.JSONPb
}

// NewDecoder decodes a whole request body, improving duration errors.
func (j namingJSONPb) NewDecoder(r io.Reader) runtime.Decoder {
	return runtime.DecoderFunc(func(v any) error {
		data, err := io.ReadAll(r)
		if err != nil {
			return err
		}
		if len(data) == 0 {
			return io.EOF
		}
		err = j.Unmarshal(data, v)
		if err == nil {
			return nil
		}
		return nameDurationField(data, err)
	})
}

var badDuration = regexp.MustCompile(`invalid google\.protobuf\.Duration value ("(?:[^"\\]|\\.)*")`)

// nameDurationField rewrites a protojson duration error into "FIELD:
// invalid duration "V": durations are seconds with an s suffix, e.g.
// \"600s\"", finding FIELD by the offending value in the body.
func nameDurationField(body []byte, err error) error {
	m := badDuration.FindStringSubmatch(err.Error())
	if m == nil {
		return err
	}
	var bad string
	if json.Unmarshal([]byte(m[1]), &bad) != nil {
		return err
	}
	field := "duration"
	var obj map[string]any
	if json.Unmarshal(body, &obj) == nil {
		if k, ok := findKey(obj, bad, ""); ok {
			field = k
		}
	}
	return fmt.Errorf("%s: invalid duration %q: durations are seconds with an s suffix, e.g. \"600s\" or \"0.5s\"", field, bad)
}

// findKey returns the snake_case path of the first string value equal to
// want.
func findKey(obj map[string]any, want, prefix string) (string, bool) {
	for k, v := range obj {
		name := prefix + snake(k)
		switch x := v.(type) {
		case string:
			if x == want {
				return name, true
			}
		case map[string]any:
			if n, ok := findKey(x, want, name+"."); ok {
				return n, true
			}
		}
	}
	return "", false
}

func snake(s string) string {
	var b strings.Builder
	for i, r := range s {
		if unicode.IsUpper(r) {
			if i > 0 {
				b.WriteByte('_')
			}
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}
