// Package logx builds the slog logger both commands use.
package logx

import (
	"fmt"
	"io"
	"log/slog"
)

// New returns a logger writing to w at level ("debug", "info", "warn",
// "error") in format ("text" or "json").
func New(w io.Writer, level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("log format: want text or json, got %q", format)
}
