-- The plugin's ghost text (0.11 path) against a stand-in LSP client that records what is sent:
-- the quiet time (`debounce_ms`) before a request, one request per burst of keys, `$/cancelRequest`
-- (client:cancel_request) for a request a keystroke superseded, late answers dropped, control
-- characters removed. Exact counts, no server.
--
-- Driven by tests/e2e/test_nvim.py: QD_PLUGIN, QD_RESULT.

vim.opt.runtimepath:prepend(os.getenv('QD_PLUGIN'))
local H = dofile(os.getenv('QD_PLUGIN') .. '/tests/harness.lua')
local ghost = require('quickdraft.ghost')

-- The stand-in client: requests are recorded and answered by the scenario (through their
-- handlers), cancellations are recorded.
local sent, cancelled = {}, {}
local client = {
  id = 1,
  name = 'quickdraft',
  offset_encoding = 'utf-16',
  server_capabilities = { inlineCompletionProvider = true },
}
function client:request(method, params, handler)
  local id = #sent + 1
  table.insert(sent, {
    id = id,
    method = method,
    line = params.position.line,
    col = params.position.character,
    trigger = params.context.triggerKind,
    handler = handler,
  })
  return true, id
end
function client:cancel_request(id)
  table.insert(cancelled, id)
  return true
end
function client:exec_cmd() end
vim.lsp.get_clients = function(filter)
  if filter and filter.name and filter.name ~= client.name then
    return {}
  end
  return { client }
end
vim.lsp.get_client_by_id = function(id)
  return id == client.id and client or nil
end

local QUIET_MS = 80

local function ids(list)
  return vim.tbl_map(function(r)
    return r.id
  end, list)
end

H.run(function()
  local bufnr = vim.api.nvim_get_current_buf()
  vim.api.nvim_buf_set_lines(bufnr, 0, -1, false, { 'x = 1' })
  ghost.attach(bufnr, { debounce_ms = QUIET_MS })

  H.type('Go')
  H.eq('nothing is sent within the quiet time', 0, #sent)
  H.wait(function()
    return #sent >= 1
  end, 3000)
  H.eq('entering Insert mode asks once, after the quiet time', 1, #sent)
  H.eq('an automatic request', 2, sent[1].trigger)

  -- A burst of keys (one input, handled before any timer) while request 1 is unanswered.
  H.type('abc')
  H.eq('the first keystroke cancels the request in flight', { 1 }, cancelled)
  H.eq('no request during the burst', 1, #sent)
  H.wait(function()
    return #sent >= 2
  end, 3000)
  H.eq('no request is left to send after the burst', false, ghost.waiting(bufnr))
  H.eq('a burst sends one request, for where it ended', { 2, 3 }, { #sent, sent[2].col })

  -- The superseded request's late answer is dropped; the current one is shown without the
  -- control characters the model wrote.
  sent[1].handler(nil, { items = { { insertText = 'stale' } } })
  H.eq('a late answer to a superseded request shows nothing', nil, H.ghost_text())
  sent[2].handler(nil, { items = { { insertText = 'de\17f\0 = 2\r\n\tpass\27' } } })
  H.eq('the answer is shown without control characters', 'def = 2\n\tpass', H.ghost_text())
  H.eq('an answered request is never cancelled', { 1 }, cancelled)

  -- Typing what the suggestion starts with asks nothing; accepting inserts the clean text.
  H.type('d')
  H.eq('typing through the suggestion schedules no request', false, ghost.waiting(bufnr))
  H.eq('typing through the suggestion sends nothing', 2, #sent)
  H.type('<Cmd>lua require("quickdraft.ghost").accept()<CR>')
  H.eq('accepting inserts the text without control characters', { 'x = 1', 'abcdef = 2', '\tpass' },
    vim.api.nvim_buf_get_lines(bufnr, 0, -1, false))

  -- The accept asks for what follows; leaving Insert mode cancels that request.
  H.wait(function()
    return #sent >= 3
  end, 3000)
  H.eq('after accepting, one request for the new position', 3, #sent)
  H.type('<Esc>')
  H.eq('leaving Insert mode cancels the request in flight', { 1, 3 }, cancelled)
  H.eq('leaving Insert mode leaves no request to send', false, ghost.waiting(bufnr))
  H.eq('nothing is sent outside Insert mode', 3, #sent)

  -- A quiet time of 0 asks on the next turn of the event loop; one per input all the same.
  ghost.attach(bufnr, { debounce_ms = 0 })
  H.type('A')
  H.wait(function()
    return #sent >= 4
  end, 3000)
  H.type('yz')
  H.wait(function()
    return #sent >= 5
  end, 3000)
  H.eq('no request is left to send after the input', false, ghost.waiting(bufnr))
  H.eq('with debounce_ms = 0 each input asks once', 5, #sent)
  H.eq('the request superseded by the next input was cancelled', { 1, 3, 4 }, cancelled)
  H.eq('the plugin counts what it sent and cancelled', { sent = 5, cancelled = 3 }, ghost.requests)
  H.data.requests = vim.tbl_map(function(r)
    return { id = r.id, line = r.line, col = r.col }
  end, sent)
  H.data.cancelled = vim.deepcopy(cancelled)
  H.data.sent_ids = ids(sent)
  H.type('<Esc>')
end)
