-- The server's state as a statusline shows it: `$/quickdraft/status` (loading, ready, error,
-- unavailable), LSP work-done progress (`$/progress`) while the models load, and the last
-- `$/quickdraft/stats`.
--
-- Pure functions, unit-tested by tests/config_spec.lua.

local stats = require('quickdraft.stats')

local M = {}

--- The states `$/quickdraft/status` may name.
M.server_states = { loading = true, ready = true, error = true, unavailable = true }

--- Marks in front of the states that need attention.
M.icons = { starting = '…', loading = '…', error = '✗', unavailable = '⚠' }

--- Longest message a statusline shows (:QuickdraftStatus shows all of it).
M.max_message = 60

--- The params of `$/quickdraft/status`, or nil when they name no known state (then ignored).
---@param raw any
---@return table|nil { state, message, backend }
function M.normalize(raw)
  if type(raw) ~= 'table' or type(raw.state) ~= 'string' or not M.server_states[raw.state] then
    return nil
  end
  local message = type(raw.message) == 'string' and vim.trim((raw.message:gsub('%s+', ' '))) or ''
  return {
    state = raw.state,
    message = message,
    backend = type(raw.backend) == 'string' and raw.backend or nil,
  }
end

--- One line for a `$/progress` value: `title: message (40%)`; nil once it has ended.
---@param value table|nil the `value` of `$/progress` params
---@return string|nil
function M.progress_text(value)
  if type(value) ~= 'table' or value.kind == 'end' then
    return nil
  end
  local parts = {}
  for _, part in ipairs({ value.title, value.message }) do
    if type(part) == 'string' and vim.trim(part) ~= '' then
      table.insert(parts, vim.trim(part))
    end
  end
  local text = table.concat(parts, ': ')
  if type(value.percentage) == 'number' then
    text = text .. (text == '' and '' or ' ') .. ('(%d%%)'):format(value.percentage)
  end
  return text ~= '' and text or nil
end

--- The state to show for one client: its own ('starting', 'stopped') until it runs, then what
--- the server says. A server that never sends `$/quickdraft/status` (older ones) is 'starting'
--- until its first stats, then 'ready'.
---@param client_state string 'starting'|'running'|'stopped'
---@param server table|nil a normalized status
---@param has_stats boolean
---@return string
function M.resolve(client_state, server, has_stats)
  if client_state ~= 'running' then
    return client_state
  end
  if not server then
    return has_stats and 'ready' or 'starting'
  end
  return server.state
end

local function shorten(text)
  if vim.fn.strchars(text) <= M.max_message then
    return text
  end
  return vim.fn.strcharpart(text, 0, M.max_message - 1) .. '…'
end

--- The server's step as a person reads it: without a leading `quickdraft:` (the statusline
--- says whose it is), '' when there is none.
---@param step string|nil
---@return string
function M.step(step)
  if type(step) ~= 'string' then
    return ''
  end
  local text = vim.trim(step)
  local without = text:match('^[Qq][Uu][Ii][Cc][Kk][Dd][Rr][Aa][Ff][Tt]:%s*(.*)$')
  return without or text
end

--- `<state>: <step>`, or the step alone where it starts with the state's word (`loading models`,
--- not `loading: loading models`), or the state alone without a step.
---@param state string
---@param step string|nil
---@return string
function M.with_step(state, step)
  local text = M.step(step)
  if text == '' then
    return state
  end
  text = shorten(text)
  local first = text:match('^(%a+)')
  if first and first:lower() == state then
    return text
  end
  return state .. ': ' .. text
end

--- The statusline text: '' without a server; `qd … loading: <step>` (`qd … loading models`),
--- `qd ✗ error: <why>`, `qd ⚠ unavailable: <why>`, `qd ready` until the first completion, then
--- the last completion's latency and what sped it up (`qd 84 ms · copied 12 of 15 tokens`);
--- while a request has waited over a second, the server's progress for it
--- (`qd … reading app.py: 1,280 of 5,800 tokens`).
---@param state string from resolve(), or 'inactive'
---@param message string|nil the server's message
---@param progress string|nil from progress_text()
---@param last table|nil the last stats
---@return string
function M.line(state, message, progress, last)
  if state == 'inactive' then
    return ''
  end
  if state == 'ready' then
    if progress and M.step(progress) ~= '' then
      -- a request waiting over a second: what the model does for it (`reading app.py: ...`)
      return 'qd ' .. M.icons.loading .. ' ' .. shorten(M.step(progress))
    end
    return 'qd ' .. (last and stats.format(last) or 'ready')
  end
  local icon = M.icons[state]
  local prefix = 'qd ' .. (icon and (icon .. ' ') or '')
  if state == 'loading' or state == 'starting' then
    return prefix .. M.with_step(state, progress or message)
  end
  if message and message ~= '' then
    return prefix .. state .. ': ' .. shorten(message)
  end
  return prefix .. state
end

return M
