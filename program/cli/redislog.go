package cli

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/redis/go-redis/v9"
)

// redisLog carries go-redis's own messages (a connection pool that cannot
// dial, a failed health check) into the process's log as warnings with
// component=redis. Left alone, go-redis prints them to stderr in its own
// format, and a --log-format json log would no longer be JSON line by line.
type redisLog struct{ log *slog.Logger }

func (r redisLog) Printf(_ context.Context, format string, v ...any) {
	r.log.Warn(fmt.Sprintf(format, v...))
}

// routeRedisLog makes log go-redis's logger. go-redis has one logger per
// process, which is why the command, not a program, sets it.
func routeRedisLog(log *slog.Logger) {
	redis.SetLogger(redisLog{log.With("component", "redis")})
}
