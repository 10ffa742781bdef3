package process

import (
	"fmt"
	"io"
	"log/slog"

	"github.com/go-logr/logr"
)

// NewLogger writes one JSON object per line. logr's V(n) maps to slog level
// -n, so debug (slog's -4) shows V(1) to V(4). level is "info" (or empty) or
// "debug"; any other is an error, returned with a usable info-level logger.
func NewLogger(level string, w io.Writer) (logr.Logger, error) {
	var l slog.Level
	switch level {
	case "info", "":
		l = slog.LevelInfo
	case "debug":
		l = slog.LevelDebug
	default:
		log, _ := NewLogger("info", w)
		return log, fmt.Errorf("--log-level must be info or debug, got %q", level)
	}
	return logr.FromSlogHandler(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: l})), nil
}
