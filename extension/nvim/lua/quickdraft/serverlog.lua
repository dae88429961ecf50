-- The server's stderr in the LSP log (:QuickdraftLog), each line at its own level.
--
-- Neovim logs every stderr chunk of a language server as ERROR; quickdraft's stderr is its log
-- (`2026-12-01 10:00:00,123 WARNING llama_cpp: ...`, see server/quickdraft/lsp/cli.py) plus
-- progress bars and third-party prints while models load, so a normal start looked like a list of
-- failures. The same rules as the VS Code extension's src/serverLog.ts:
--
-- - a log record (`<date> <time> LEVEL logger: message`; up to two words before the level) is
--   logged at its level (DEBUG, INFO, WARNING, ERROR, CRITICAL);
-- - a progress bar (tqdm) is INFO, shown as its last state;
-- - a failure (a Python traceback, `SomeError: ...`, argparse's `prog: error: ...`, a fatal
--   error or a failed assertion of the native runtime) is ERROR, and so are the lines after it;
-- - any other line continues the level of the line before (INFO at the start).
--
-- classify() is pure (tested by tests/config_spec.lua); stderr_handler() feeds vim.lsp.log.

local M = {}

local LEVELS = { DEBUG = 'DEBUG', INFO = 'INFO', WARNING = 'WARN', WARN = 'WARN', ERROR = 'ERROR', CRITICAL = 'ERROR' }

local FAILURES = {
  '^Traceback %(most recent call last%)',
  '^[%w_.]*Error%f[^%w_]',
  '^[%w_.]*Exception%f[^%w_]',
  '^error: ',
  '%serror: ',
  '^Fatal Python error',
  'GGML_ASSERT',
  '^terminate called',
}

local function is_progress_bar(text)
  return text:find('%d+%%|.*|') ~= nil or text:find('|%s*%d+%.?%d*[kMG]?/%d+%.?%d*[kMG]?%s*%[') ~= nil
end

--- The level a log record carries: up to two words, then the level as a word of its own.
---@param text string
---@return string|nil 'DEBUG'|'INFO'|'WARN'|'ERROR'
function M.record_level(text)
  local rest = text
  for _ = 0, 2 do
    local word = rest:match('^(%u+)%f[^%w_]')
    if word and LEVELS[word] then
      return LEVELS[word]
    end
    local after = rest:match('^%S+ (.*)$')
    if not after then
      return nil
    end
    rest = after
  end
  return nil
end

local function is_failure(text)
  for _, pattern in ipairs(FAILURES) do
    if text:find(pattern) then
      return true
    end
  end
  return false
end

--- A classifier: classify(line) -> level ('DEBUG'|'INFO'|'WARN'|'ERROR'), text.
---@return table
function M.new()
  local self = { current = nil }
  function self.classify(line)
    -- A bar redraws itself with carriage returns: keep what it showed last.
    local segments = {}
    for segment in (line .. '\r'):gmatch('([^\r]*)\r') do
      if vim.trim(segment) ~= '' then
        table.insert(segments, segment)
      end
    end
    local text = (segments[#segments] or ''):gsub('%s+$', '')
    if #segments > 1 or is_progress_bar(text) then
      return 'INFO', text
    end
    local level = M.record_level(text)
    if level then
      self.current = level
      return level, text
    end
    if is_failure(text) then
      self.current = 'ERROR'
      return 'ERROR', text
    end
    return self.current or 'INFO', text
  end
  return self
end

--- A `stderr` callback for vim.system(): splits the chunks into lines and logs each at its level
--- with `log` (default vim.lsp.log), as `quickdraft stderr <line>`; the last partial line at
--- the end of the stream.
---@param log table|nil { debug, info, warn, error } functions
---@return fun(err: string|nil, chunk: string|nil)
function M.stderr_handler(log)
  log = log or vim.lsp.log
  local classifier = M.new()
  local pending = ''
  local writers = { DEBUG = log.debug, INFO = log.info, WARN = log.warn, ERROR = log.error }
  local function emit(line)
    local level, text = classifier.classify(line)
    if text ~= '' then
      writers[level]('quickdraft', 'stderr', text)
    end
  end
  return function(err, chunk)
    if err then
      log.error('quickdraft', 'stderr', err)
    end
    if chunk == nil then
      if pending ~= '' then
        emit(pending)
        pending = ''
      end
      return
    end
    pending = pending .. chunk
    while true do
      local newline = pending:find('\n', 1, true)
      if not newline then
        break
      end
      emit((pending:sub(1, newline - 1):gsub('\r$', '')))
      pending = pending:sub(newline + 1)
    end
  end
end

--- Start the server as vim.lsp.rpc.start() does, with its stderr through stderr_handler()
--- instead of Neovim's default (every chunk at ERROR). Neovim has no option for this, so
--- vim.system is wrapped for that one synchronous call; should a later Neovim spawn otherwise,
--- the server still starts and its stderr is logged Neovim's way.
---@param cmd string[]
---@param dispatchers table
---@param config table the client's config (cmd_cwd, cmd_env, detached)
---@return table vim.lsp.rpc.PublicClient
function M.start(cmd, dispatchers, config)
  if vim.fn.executable(cmd[1]) ~= 1 then
    error(('quickdraft: %s is not executable: set server_path (:help quickdraft-install)'):format(cmd[1]), 0)
  end
  local system = vim.system
  local handler = M.stderr_handler()
  vim.system = function(args, opts, on_exit)
    if vim.deep_equal(args, cmd) and type(opts) == 'table' then
      opts = vim.tbl_extend('force', opts, { stderr = handler })
    end
    return system(args, opts, on_exit)
  end
  local ok, rpc = pcall(vim.lsp.rpc.start, cmd, dispatchers, {
    cwd = config and config.cmd_cwd,
    env = config and config.cmd_env,
    detached = config and config.detached,
  })
  vim.system = system
  if not ok then
    error(rpc, 0)
  end
  return rpc
end

return M
